//! [`EtcdOptions`]: etcd serving clients over TLS, its command line, and the URL a
//! distlock client reaches it with.

use std::ffi::OsString;

use crate::tls::ServerTls;

/// Options for [`EtcdServer::start_with`](crate::EtcdServer::start_with).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Serve clients over TLS only (`https://` listen and advertise URLs with the certificate
    /// and key of `tls`; `--client-cert-auth --trusted-ca-file` when it demands client
    /// certificates). Readiness is then probed on a plain-text metrics port
    /// (`--listen-metrics-urls`), and [`EtcdServer::url`](crate::EtcdServer::url) carries the CA (and the client
    /// certificate) as distlock parameters. The files must outlive the server (keep the
    /// [`TestCerts`](crate::TestCerts)). Default: none (plain text).
    pub tls: Option<ServerTls>,
    /// Appended to etcd's command line (for example `["--auth-token-ttl", "1"]`).
    pub extra_args: Vec<String>,
}

/// The distlock URL of the member at `endpoint`: `etcd://ENDPOINT`, and with `tls`
/// `?tls=true&ca=CA_FILE` (plus `&cert=…&key=…` when it demands a client certificate).
pub(crate) fn url(endpoint: &str, tls: Option<&ServerTls>) -> String {
    let mut url = format!("etcd://{endpoint}");
    if let Some(tls) = tls {
        url.push_str(&format!("?tls=true&ca={}", tls.ca.display()));
        if tls.client_certs {
            url.push_str(&format!(
                "&cert={}&key={}",
                tls.client_cert.display(),
                tls.client_key.display()
            ));
        }
    }
    url
}

/// etcd's command line for serving clients with `tls` (the client URLs are `https://`),
/// `/health` on the plain-text `metrics_port`.
pub(crate) fn tls_args(tls: &ServerTls, metrics_port: u16) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    args.extend([
        "--cert-file".into(),
        tls.cert.clone().into(),
        "--key-file".into(),
        tls.key.clone().into(),
        "--listen-metrics-urls".into(),
        format!("http://127.0.0.1:{metrics_port}").into(),
    ]);
    if tls.client_certs {
        args.extend([
            "--client-cert-auth".into(),
            "--trusted-ca-file".into(),
            tls.ca.clone().into(),
        ]);
    }
    args
}
