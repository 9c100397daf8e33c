//! HTTPS for the API: a PEM certificate chain and key named in settings.json the way Kestrel
//! (and so dotnet-monitor) reads them, `Kestrel:Certificates:Default:Path` and `…:KeyPath`, served
//! with rustls ([`TlsListener`]).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Connections whose handshake is done, waiting for the server to take them.
const ESTABLISHED_QUEUE: usize = 64;

/// Handshakes running at once; more connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 256;

/// How long a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The `Kestrel` section of settings.json: only the default certificate is read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct KestrelConfig {
    #[serde(default)]
    pub certificates: CertificatesConfig,
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

/// A listener for [`axum::serve`] that hands out TLS streams: a task accepts connections and
/// runs their handshakes concurrently (each within [`HANDSHAKE_TIMEOUT`]), so a slow client
/// holds up no one; failed handshakes are logged and dropped.
pub struct TlsListener {
    established: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (sender, established) = mpsc::channel(ESTABLISHED_QUEUE);
        let acceptor = TlsAcceptor::from(config);
        let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = Arc::clone(&handshakes).acquire_owned().await else {
                    return;
                };
                // The server dropped its end: it stopped, and so does accepting.
                let accepted = tokio::select! {
                    () = sender.closed() => return,
                    accepted = listener.accept() => accepted,
                };
                let (tcp, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors and the like: wait rather than spin.
                        tracing::warn!(%error, "accepting an HTTPS connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let sender = sender.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = sender.send((stream, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            established,
            local_addr,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.established.recv().await {
            Some(established) => established,
            // The accepting task ended (the runtime is shutting down): accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
