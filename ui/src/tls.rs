//! The `Kestrel` section of settings.json: HTTPS for the API, a PEM certificate chain and key
//! named the way Kestrel (and so dotnet-monitor) reads them, `Kestrel:Certificates:Default:Path`
//! and `…:KeyPath`, served with rustls by [`crate::listener`]; and the listeners' connection
//! limits, `Kestrel:Limits`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use crate::listener::LimitsConfig;

/// The `Kestrel` section of settings.json: the default certificate and the limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct KestrelConfig {
    #[serde(default)]
    pub certificates: CertificatesConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
}

/// `Kestrel:Certificates`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct CertificatesConfig {
    #[serde(default)]
    pub default: Option<CertificateConfig>,
}

/// `Kestrel:Certificates:Default`: PEM files.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct CertificateConfig {
    /// The certificate chain, leaf first.
    pub path: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1), unencrypted.
    pub key_path: PathBuf,
}

/// Why HTTPS cannot be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error(
        "https needs a certificate: set Kestrel:Certificates:Default:Path (PEM chain) and \
         KeyPath (PEM key) in settings.json or as CLRSCOPE_Kestrel__Certificates__Default__Path \
         and __KeyPath"
    )]
    NoCertificate,

    #[error("reading the certificate chain {path}: {reason}")]
    Certificate { path: PathBuf, reason: String },

    #[error("reading the private key {path}: {reason}")]
    Key { path: PathBuf, reason: String },

    #[error("the certificate and key do not make a TLS server: {0}")]
    Config(#[from] rustls::Error),
}

impl KestrelConfig {
    /// The TLS server configuration of the default certificate (HTTP/1.1, what the server speaks).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let certificate = self
            .certificates
            .default
            .as_ref()
            .ok_or(TlsError::NoCertificate)?;
        let chain = read_chain(&certificate.path)?;
        let key =
            PrivateKeyDer::from_pem_file(&certificate.key_path).map_err(|e| TlsError::Key {
                path: certificate.key_path.clone(),
                reason: e.to_string(),
            })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let failed = |reason: String| TlsError::Certificate {
        path: path.to_path_buf(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| failed(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(e.to_string()))?;
    if chain.is_empty() {
        return Err(failed("no CERTIFICATE block".into()));
    }
    Ok(chain)
}
