//! Certificates made for one test run: a CA, a server certificate signed by it for
//! `127.0.0.1` and `localhost`, a client certificate signed by it (mutual TLS), and a second,
//! unrelated CA for "wrong CA" tests, written as PEM files into a temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tempfile::TempDir;

/// PEM files of a CA, a server certificate and a client certificate it signed, and an
/// unrelated CA, generated fresh (ECDSA P-256) by [`TestCerts::generate`].
///
/// The files live as long as this value: keep it alive while a server started with
/// [`server_tls`](Self::server_tls) runs (a restart reads them again). Dropping it removes
/// the directory.
#[derive(Debug)]
pub struct TestCerts {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    other_ca: PathBuf,
    dir: TempDir,
}

/// What a server needs to listen with TLS: its certificate and key, the CA its clients'
/// certificates must chain to, and whether it demands a client certificate. Made by
/// [`TestCerts::server_tls`]; the files belong to that [`TestCerts`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTls {
    /// The server's certificate (PEM), valid for `127.0.0.1` and `localhost`.
    pub cert: PathBuf,
    /// The server certificate's private key (PEM).
    pub key: PathBuf,
    /// The CA (PEM) that signed the server's and the clients' certificates.
    pub ca: PathBuf,
    /// Refuse clients without a certificate signed by `ca` (mutual TLS).
    pub client_certs: bool,
    /// The certificate the test kit's own clients present when `client_certs` is set.
    pub client_cert: PathBuf,
    /// Its private key.
    pub client_key: PathBuf,
}

impl ServerTls {
    /// What a redis-rs TLS client needs to trust the server (and to present the client
    /// certificate when the server demands one).
    pub(crate) fn redis_certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client_certs.then(|| redis::ClientTlsConfig {
                client_cert: read(&self.client_cert),
                client_key: read(&self.client_key),
            }),
            root_cert: Some(read(&self.ca)),
        }
    }

    /// What an etcd-client TLS connection needs, likewise.
    pub(crate) fn etcd_options(&self) -> etcd_client::TlsOptions {
        let mut options = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read(&self.ca)));
        if self.client_certs {
            options = options.identity(etcd_client::Identity::from_pem(
                read(&self.client_cert),
                read(&self.client_key),
            ));
        }
        options
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("lock-testkit: cannot read {}: {e}", path.display()))
}

impl TestCerts {
    /// Generates the certificates and writes them into a new temporary directory.
    ///
    /// # Panics
    ///
    /// If a key cannot be generated or a file cannot be written.
    pub fn generate() -> TestCerts {
        let dir = tempfile::Builder::new()
            .prefix("lock-testkit-tls-")
            .tempdir()
            .unwrap_or_else(|e| panic!("lock-testkit: cannot create a temp dir: {e}"));
        let write = |name: &str, pem: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem)
                .unwrap_or_else(|e| panic!("lock-testkit: cannot write {}: {e}", path.display()));
            path
        };
        let (ca_pem, issuer) = new_ca("distlock test CA");
        let (other_pem, _) = new_ca("unrelated test CA");
        let (server_pem, server_key) = new_leaf(
            &issuer,
            "distlock test server",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_pem, client_key) = new_leaf(
            &issuer,
            "distlock test client",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        TestCerts {
            ca: write("ca.pem", ca_pem),
            server_cert: write("server.pem", server_pem),
            server_key: write("server-key.pem", server_key),
            client_cert: write("client.pem", client_pem),
            client_key: write("client-key.pem", client_key),
            other_ca: write("other-ca.pem", other_pem),
            dir,
        }
    }

    /// The CA certificate that signed the server and client certificates.
    pub fn ca(&self) -> &Path {
        &self.ca
    }

    /// The server certificate (for `127.0.0.1` and `localhost`).
    pub fn server_cert(&self) -> &Path {
        &self.server_cert
    }

    /// The server certificate's private key.
    pub fn server_key(&self) -> &Path {
        &self.server_key
    }

    /// The client certificate, for servers that demand one.
    pub fn client_cert(&self) -> &Path {
        &self.client_cert
    }

    /// The client certificate's private key.
    pub fn client_key(&self) -> &Path {
        &self.client_key
    }

    /// A CA that signed nothing here: a client trusting only it must refuse the server.
    pub fn other_ca(&self) -> &Path {
        &self.other_ca
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server side of these certificates; with `client_certs` the server refuses
    /// clients that do not present [`client_cert`](Self::client_cert) (or another one
    /// signed by [`ca`](Self::ca)).
    pub fn server_tls(&self, client_certs: bool) -> ServerTls {
        ServerTls {
            cert: self.server_cert.clone(),
            key: self.server_key.clone(),
            ca: self.ca.clone(),
            client_certs,
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
        }
    }
}

/// A self-signed CA: its PEM and the issuer that signs leaves with it.
fn new_ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::new()).expect("no names is valid");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    let key = KeyPair::generate().unwrap_or_else(|e| panic!("lock-testkit: CA key: {e}"));
    let cert = params
        .self_signed(&key)
        .unwrap_or_else(|e| panic!("lock-testkit: CA certificate: {e}"));
    (cert.pem(), Issuer::new(params, key))
}

/// A certificate for `127.0.0.1` and `localhost` signed by `issuer`: its PEM and its key's.
fn new_leaf(
    issuer: &Issuer<'static, KeyPair>,
    name: &str,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let mut params = CertificateParams::new(names).expect("an IP and a DNS name are valid");
    params.distinguished_name.push(DnType::CommonName, name);
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap_or_else(|e| panic!("lock-testkit: leaf key: {e}"));
    let cert = params
        .signed_by(&key, issuer)
        .unwrap_or_else(|e| panic!("lock-testkit: leaf certificate: {e}"));
    (cert.pem(), key.serialize_pem())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file is written as PEM, and the two CAs differ.
    #[test]
    fn writes_pem_files() {
        let certs = TestCerts::generate();
        for path in [
            certs.ca(),
            certs.server_cert(),
            certs.client_cert(),
            certs.other_ca(),
        ] {
            let text = std::fs::read_to_string(path).unwrap();
            assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{text}");
        }
        for path in [certs.server_key(), certs.client_key()] {
            let text = std::fs::read_to_string(path).unwrap();
            assert!(text.contains("PRIVATE KEY-----"), "{text}");
        }
        assert_ne!(
            std::fs::read(certs.ca()).unwrap(),
            std::fs::read(certs.other_ca()).unwrap()
        );
        assert!(certs.server_tls(true).client_certs);
    }
}
