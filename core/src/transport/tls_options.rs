//! What an `amqps://` connection is told about TLS: here, beside the
//! transport that reads it, whether or not the `tls` feature builds TLS.

/// How an `amqps://` connection verifies the broker and presents itself.
/// The files are PEM and are read once, when the connection opens; a
/// redial after a loss reuses what was read. A handshake that fails is an
/// [`ErrorKind::Tls`](crate::ErrorKind::Tls) error saying why; a file that
/// cannot be read is `InvalidArgument`, naming it.
///
/// ```no_run
/// use acemq::{Connection, ConnectionOptions, TlsOptions};
///
/// # async fn run() -> acemq::Result<()> {
/// let tls = TlsOptions {
///     ca_file: Some("/etc/acemq/ca.pem".into()),
///     cert_file: Some("/etc/acemq/client.pem".into()),
///     key_file: Some("/etc/acemq/client.key".into()),
///     ..Default::default()
/// };
/// let options = ConnectionOptions { tls: Some(tls), ..Default::default() };
/// let mq = Connection::open_with("amqps://app:secret@mq.internal/prod", options).await?;
/// # mq.close().await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// The CA certificates to trust, instead of the system's store. A
    /// private CA (RabbitMQ's tls-gen, a company CA) is never in the system
    /// store.
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate (with its chain) to present, for a broker with
    /// `ssl_options.verify = verify_peer`. Needs `key_file`.
    pub cert_file: Option<std::path::PathBuf>,
    /// The client certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<std::path::PathBuf>,
    /// Verify the broker's certificate and its name (default true). False
    /// accepts any certificate for any name: still encrypted, but to
    /// whoever answered. For tests against a throwaway broker only.
    pub verify: bool,
    /// The name the broker's certificate must carry, when it is not the
    /// URL's host (a broker reached by IP, or through a tunnel).
    pub server_name: Option<String>,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions { ca_file: None, cert_file: None, key_file: None, verify: true, server_name: None }
    }
}
