//! The certificate files of a TLS connection, as every backend's URL names them.

use std::path::{Path, PathBuf};

use super::LockUrl;
use crate::error::Result;

/// The files a TLS connection trusts and presents: a CA file (PEM) trusted instead of the
/// system's root certificates, and a client certificate with its key (PEM) for servers
/// that demand one. Both are optional; the files are read only when connecting.
///
/// Every backend that speaks TLS names them with the same URL parameters, `ca=PATH`,
/// `cert=PATH` and `key=PATH` ([`TlsFiles::PARAMS`]); `cert` and `key` go together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    ca_file: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
}

impl TlsFiles {
    /// The URL parameters these files are read from.
    pub const PARAMS: [&'static str; 3] = ["ca", "cert", "key"];

    /// The files `url`'s `ca`, `cert` and `key` parameters name.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl) for `cert` without `key` or the
    /// reverse.
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        let client_cert =
            match (url.param("cert"), url.param("key")) {
                (Some(cert), Some(key)) => Some((cert.into(), key.into())),
                (None, None) => None,
                _ => return Err(url.invalid(
                    "parameters `cert` and `key` go together (a client certificate and its key)",
                )),
            };
        Ok(TlsFiles {
            ca_file: url.param("ca").map(PathBuf::from),
            client_cert,
        })
    }

    /// Trusts the CA in `path` instead of the system's roots.
    pub fn set_ca_file(&mut self, path: impl Into<PathBuf>) {
        self.ca_file = Some(path.into());
    }

    /// Presents the client certificate in `cert`, with its private key in `key`.
    pub fn set_client_cert(&mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) {
        self.client_cert = Some((cert.into(), key.into()));
    }

    /// The CA file trusted instead of the system's roots, if any.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    /// The client certificate and key files, if any.
    pub fn client_cert(&self) -> Option<(&Path, &Path)> {
        self.client_cert
            .as_ref()
            .map(|(cert, key)| (cert.as_path(), key.as_path()))
    }

    /// Whether no file is named (the system's roots, no client certificate).
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.client_cert.is_none()
    }

    /// The URL parameters that name these files, in the order [`from_url`](Self::from_url)
    /// reads them back.
    pub fn params(&self) -> Vec<(String, String)> {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let mut params = Vec::new();
        if let Some(ca) = &self.ca_file {
            params.push(("ca".to_owned(), path(ca)));
        }
        if let Some((cert, key)) = &self.client_cert {
            params.push(("cert".to_owned(), path(cert)));
            params.push(("key".to_owned(), path(key)));
        }
        params
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_round_trip_through_url_parameters() {
        let url: LockUrl = "x://h?ca=/c.pem&cert=/a.pem&key=/k.pem".parse().unwrap();
        let files = TlsFiles::from_url(&url).unwrap();
        assert_eq!(files.ca_file(), Some(Path::new("/c.pem")));
        assert_eq!(
            files.client_cert(),
            Some((Path::new("/a.pem"), Path::new("/k.pem")))
        );
        assert!(!files.is_empty());
        let mut url2: LockUrl = "x://h".parse().unwrap();
        url2.params = files.params();
        assert_eq!(TlsFiles::from_url(&url2).unwrap(), files);
        let none: LockUrl = "x://h".parse().unwrap();
        assert!(TlsFiles::from_url(&none).unwrap().is_empty());
        for lone in ["x://h?cert=/a.pem", "x://h?key=/k.pem"] {
            let url: LockUrl = lone.parse().unwrap();
            let e = TlsFiles::from_url(&url).unwrap_err();
            assert!(e.to_string().contains("go together"), "{lone}: {e}");
        }
    }
}
