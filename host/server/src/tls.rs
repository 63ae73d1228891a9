//! https for the API (rustls, no OpenSSL): the server's certificate chain and key from PEM
//! files, swapped in place when reloaded (SIGHUP), and a listener that does each handshake in
//! a task of its own, so one slow client never holds up the accept loop.

use arc_swap::ArcSwap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;

/// A handshake not done by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes under way at once; past it, new connections are closed at once.
const MAX_HANDSHAKES: usize = 1024;
/// Connections handshaken and not yet taken by the server.
const READY_QUEUE: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("invalid TLS certificate or key: {0}")]
    Invalid(String),
}

#[derive(Debug)]
struct Resolver {
    current: ArcSwap<CertifiedKey>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The server's TLS identity and the acceptor that uses it.
pub struct Tls {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    resolver: Arc<Resolver>,
    acceptor: TlsAcceptor,
}

impl Tls {
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = certified_key(cert_path, key_path, &provider)?;
        let resolver = Arc::new(Resolver {
            current: ArcSwap::from_pointee(key),
        });
        let mut config = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Invalid(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            provider,
            resolver,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Reads the files again; new handshakes use them, connections open keep theirs. On an
    /// error the old certificate stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let key = certified_key(&self.cert_path, &self.key_path, &self.provider)?;
        self.resolver.current.store(Arc::new(key));
        Ok(())
    }

    /// Accepts on `tcp`, handshaking each connection in its own task.
    pub fn listener(&self, tcp: TcpListener) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (ready, incoming) = mpsc::channel(READY_QUEUE);
        let acceptor = self.acceptor.clone();
        let accepting = tokio::spawn(accept_loop(tcp, acceptor, ready));
        Ok(TlsListener {
            incoming,
            local,
            accepting,
        })
    }
}

fn read_error(path: &Path, error: impl std::fmt::Display) -> TlsError {
    TlsError::Read {
        path: path.display().to_string(),
        reason: error.to_string(),
    }
}

fn certified_key(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| read_error(cert_path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read_error(cert_path, e))?;
    if chain.is_empty() {
        return Err(read_error(cert_path, "no PEM certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| read_error(key_path, e))?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Invalid(format!("{}: {e}", key_path.display())))?;
    let certified = CertifiedKey::new(chain, signing_key);
    certified
        .keys_match()
        .map_err(|e| TlsError::Invalid(format!("the key does not match the certificate: {e}")))?;
    Ok(certified)
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let (stream, peer) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, say: back off rather than spin.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "too many TLS handshakes under way; connection closed");
            continue;
        };
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// An axum listener of TLS connections, handshaken already.
pub struct TlsListener {
    incoming: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(connection) => connection,
            // The accept loop never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
