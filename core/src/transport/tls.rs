//! TLS for `amqps://`, done under the frame filter.
//!
//! lapin could wrap TLS itself, but it would wrap it around the stream the
//! reactor hands it, which is [`Filtered`](super::frame_filter::Filtered):
//! the filter would then read ciphertext. So the handshake happens in the
//! reactor, on the TCP stream, and the filter sits on top of the plaintext;
//! lapin is handed the same address as `amqp://` and never knows.
//!
//! rustls with the ring provider, not aws-lc-rs (rustls' default): ring is
//! Rust with a little C and assembly that cc builds in about half a minute
//! on two cores, where aws-lc-rs compiles AWS-LC, a far larger C library,
//! with cmake. Neither needs
//! OpenSSL, at build or at run time, so the gem still builds offline. The
//! trusted CAs are the `ca_file`'s, or else the system's store
//! (rustls-native-certs: /etc/ssl/certs, or `SSL_CERT_FILE`/`SSL_CERT_DIR`).

use crate::transport::TlsOptions;
use crate::error::{Error, ErrorKind, Result};
use futures_lite::{AsyncRead, AsyncWrite};
use futures_rustls::client::TlsStream;
use futures_rustls::TlsConnector;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::io::{self, IoSlice};
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// The TLS settings of one connection, read once when it opens: files are
/// read there (a missing one is reported then, not at the first dial), and
/// every dial after a loss reuses them.
#[derive(Clone)]
pub(crate) struct Tls {
    config: Arc<ClientConfig>,
    server_name: Option<String>,
    /// What the trust came from, for messages.
    trust: Trust,
    client_cert: bool,
    /// Whether the broker asked for a client certificate in the last
    /// handshake (set by `Asked`, cleared at every dial).
    asked: Arc<AtomicBool>,
}

/// The client's certificate, if any, handed to rustls when the broker asks
/// for one, and the asking noted. Under TLS 1.3 a broker that refuses the
/// certificate (or its absence) says so in an alert after the client's side
/// of the handshake is done, then closes; when the close's reset reaches the
/// client before the alert is read, the kernel drops the alert and all the
/// client sees is a reset. That the broker asked is what explains it.
#[derive(Debug)]
struct Asked {
    key: Option<Arc<rustls::sign::CertifiedKey>>,
    asked: Arc<AtomicBool>,
}

impl rustls::client::ResolvesClientCert for Asked {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.asked.store(true, Ordering::Release);
        self.key.clone()
    }

    fn has_certs(&self) -> bool {
        self.key.is_some()
    }
}

#[derive(Clone, Debug)]
enum Trust {
    CaFile(String),
    System,
    Nothing,
}

/// The crypto: the process's default provider when the service installed
/// one (`rustls::crypto::aws_lc_rs::default_provider().install_default()`,
/// which brings the post-quantum key exchange X25519MLKEM768), else ring's.
fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default().cloned().unwrap_or_else(ring_provider)
}

/// ring's provider, deprecated since rustls 0.23.48 because ring has no
/// post-quantum key exchange: the warning is about that gap, which stays
/// (aws-lc-rs, which closes it, compiles a C library with cmake, where ring
/// builds in half a minute, so it is the service's choice above, not the
/// gem's). Allowed here and nowhere else: a newer rustls that takes the
/// function away fails this one line.
#[allow(deprecated)]
fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &str, option: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::invalid(format!("cannot read the {what} {} ({e}): check tls: {{ {option}: }}", path.display()))
    })
}

fn pem_certs(what: &str, option: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = read(what, option, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::invalid(format!("the {what} {} is not PEM ({e}): check tls: {{ {option}: }}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::invalid(format!(
            "the {what} {} holds no certificate (no -----BEGIN CERTIFICATE-----): check tls: {{ {option}: }}",
            path.display()
        )));
    }
    Ok(certs)
}

impl Tls {
    /// Read `options`' files and build the client configuration. A file that
    /// is missing, unreadable or not PEM is an `InvalidArgument` naming it.
    pub(crate) fn new(options: &TlsOptions) -> Result<Tls> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::invalid(format!("cannot set up TLS: {e}")))?;
        let (builder, trust) = if !options.verify {
            (builder.dangerous().with_custom_certificate_verifier(Arc::new(NoVerification(provider()))), Trust::Nothing)
        } else {
            let mut roots = RootCertStore::empty();
            let trust = match &options.ca_file {
                Some(path) => {
                    for cert in pem_certs("CA file", "ca_file", path)? {
                        roots.add(cert).map_err(|e| {
                            Error::invalid(format!("the CA file {} holds a certificate rustls cannot use ({e})", path.display()))
                        })?;
                    }
                    Trust::CaFile(path.display().to_string())
                }
                None => {
                    let found = rustls_native_certs::load_native_certs();
                    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
                    if added == 0 {
                        let why = found.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
                        return Err(Error::invalid(format!(
                            "no CA certificates found in the system store{}: install ca-certificates, or pass tls: {{ ca_file: }}",
                            if why.is_empty() { String::new() } else { format!(" ({why})") }
                        )));
                    }
                    Trust::System
                }
            };
            (builder.with_root_certificates(roots), trust)
        };
        let asked = Arc::new(AtomicBool::new(false));
        let config = match (&options.cert_file, &options.key_file) {
            (Some(cert), Some(key)) => {
                let chain = pem_certs("client certificate", "cert_file", cert)?;
                let bytes = read("client key", "key_file", key)?;
                let key_der = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
                    Error::invalid(format!(
                        "the client key {} holds no private key in PEM ({e}): check tls: {{ key_file: }}",
                        key.display()
                    ))
                })?;
                let certified = rustls::sign::CertifiedKey::from_der(chain, key_der, &provider()).map_err(|e| {
                    Error::invalid(format!(
                        "the client key {} does not fit the certificate {} ({e}): check tls: {{ cert_file:, key_file: }}",
                        key.display(),
                        cert.display()
                    ))
                })?;
                builder.with_client_cert_resolver(Arc::new(Asked { key: Some(Arc::new(certified)), asked: asked.clone() }))
            }
            (None, None) => builder.with_client_cert_resolver(Arc::new(Asked { key: None, asked: asked.clone() })),
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::invalid("tls: needs cert_file: and key_file: together (a client certificate and its key)"))
            }
        };
        if let Some(name) = &options.server_name {
            server_name(name)?;
        }
        Ok(Tls {
            config: Arc::new(config),
            server_name: options.server_name.clone(),
            trust,
            client_cert: options.cert_file.is_some(),
            asked,
        })
    }

    /// The dialler for one address: `host` as it is in the URL, unless
    /// `server_name` overrides what the certificate must name.
    pub(crate) fn dial(&self, host: &str) -> Result<TlsDial> {
        self.asked.store(false, Ordering::Release);
        let name = self.server_name.as_deref().unwrap_or(host);
        Ok(TlsDial {
            connector: TlsConnector::from(self.config.clone()),
            server_name: server_name(name)?,
            failure: Default::default(),
            received: Default::default(),
        })
    }

    /// A dial that failed without a TLS error: when the broker asked for a
    /// client certificate and then ended the connection before sending a
    /// byte of AMQP, it refused the certificate (or its absence), whose
    /// alert the reset overtook (see `Asked`). None otherwise.
    pub(crate) fn refused_client_certificate(&self, dial: &TlsDial, endpoint: &str) -> Option<Error> {
        if !self.asked.load(Ordering::Acquire) || dial.received.load(Ordering::Acquire) {
            return None;
        }
        let what = if self.client_cert {
            "the broker asked for a client certificate and closed the connection once it had this one: it refused it; \
             it must be signed by a CA in the broker's ssl_options.cacertfile"
        } else {
            "the broker asked for a client certificate and closed the connection without one: it requires a client \
             certificate: pass tls: { cert_file:, key_file: }"
        };
        Some(Error::new(ErrorKind::Tls, format!("could not connect to {endpoint} over TLS: {what}")))
    }

    /// What a TLS failure means and what to do about it: the error a dial
    /// reports instead of lapin's I/O error.
    pub(crate) fn explain(&self, e: &rustls::Error, endpoint: &str, name: &str) -> Error {
        let trusted = match &self.trust {
            Trust::CaFile(path) => format!("a CA in ca_file {path}"),
            Trust::System => "a CA in the system store (no ca_file given)".to_owned(),
            Trust::Nothing => "anything (verify: false)".to_owned(),
        };
        let ca_hint = match &self.trust {
            Trust::CaFile(_) => "pass tls: { ca_file: } with the CA that signed it",
            _ => "pass tls: { ca_file: } with the CA that signed it (a private CA is never in the system store)",
        };
        use rustls::AlertDescription as Alert;
        let what = match e {
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                format!("the broker's certificate is not signed by {trusted}: {ca_hint}")
            }
            rustls::Error::InvalidCertificate(CertificateError::BadSignature) => {
                format!("the broker's certificate has a signature that does not verify against {trusted}: {ca_hint}")
            }
            rustls::Error::InvalidCertificate(CertificateError::Expired) => {
                "the broker's certificate has expired: the broker needs a renewed certificate (check its ssl_options.certfile)".to_owned()
            }
            rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { not_after, .. }) => format!(
                "the broker's certificate expired on {}: the broker needs a renewed certificate (check its ssl_options.certfile)",
                utc(*not_after)
            ),
            rustls::Error::InvalidCertificate(CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. }) => {
                "the broker's certificate is not valid yet: check this machine's clock, or the certificate's start date".to_owned()
            }
            rustls::Error::InvalidCertificate(CertificateError::NotValidForName) => format!(
                "the broker's certificate is not valid for {name:?}: connect by a name the certificate lists, or pass tls: {{ server_name: }} with one"
            ),
            rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { presented, .. }) => format!(
                "the broker's certificate is not valid for {name:?} (it names {}): connect by one of those, or pass tls: {{ server_name: }} with one",
                if presented.is_empty() { "no names".to_owned() } else { presented.iter().map(|n| plain_name(n)).collect::<Vec<_>>().join(", ") }
            ),
            rustls::Error::InvalidCertificate(other) => {
                format!("the broker's certificate was refused ({other:?}): {ca_hint}")
            }
            rustls::Error::AlertReceived(Alert::CertificateRequired) => {
                "the broker requires a client certificate: pass tls: { cert_file:, key_file: }".to_owned()
            }
            rustls::Error::AlertReceived(Alert::HandshakeFailure) if !self.client_cert => {
                "the broker refused the TLS handshake (handshake_failure), most often because it requires a client certificate: \
                 pass tls: { cert_file:, key_file: }"
                    .to_owned()
            }
            rustls::Error::AlertReceived(
                a @ (Alert::UnknownCA | Alert::BadCertificate | Alert::CertificateUnknown | Alert::AccessDenied),
            ) if self.client_cert => format!(
                "the broker refused the client certificate ({}): it must be signed by a CA in the broker's ssl_options.cacertfile",
                alert_name(*a)
            ),
            rustls::Error::AlertReceived(Alert::CertificateExpired) if self.client_cert => {
                "the broker refused the client certificate as expired: renew cert_file".to_owned()
            }
            rustls::Error::AlertReceived(a) => format!("the broker ended the TLS handshake ({})", alert_name(*a)),
            rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
                "the broker did not answer in TLS: is this its TLS port (5671 by default)? for its plain port use amqp://".to_owned()
            }
            other => format!("TLS failed ({other})"),
        };
        Error::new(ErrorKind::Tls, format!("could not connect to {endpoint} over TLS: {what}"))
    }
}

fn server_name(name: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(name.to_owned())
        .map_err(|_| Error::invalid(format!("{name:?} is not a host name or IP address TLS can verify: check the URL or tls: {{ server_name: }}")))
}

/// webpki's `DnsName("localhost")` and `IpAddress(127.0.0.1)` as the names
/// they are.
fn plain_name(presented: &str) -> &str {
    for prefix in ["DnsName(\"", "IpAddress("] {
        if let Some(rest) = presented.strip_prefix(prefix) {
            return rest.trim_end_matches(')').trim_end_matches('"');
        }
    }
    presented
}

fn alert_name(a: rustls::AlertDescription) -> String {
    // CertificateRequired -> certificate_required, as RFC 8446 spells it.
    // UnknownCA -> unknown_ca.
    let mut out = String::new();
    let mut after_lower = false;
    for c in format!("{a:?}").chars() {
        if c.is_ascii_uppercase() && after_lower {
            out.push('_');
        }
        after_lower = c.is_ascii_lowercase();
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// `2024-01-31 12:00:00 UTC`, for an expiry date.
fn utc(t: UnixTime) -> String {
    let secs = t.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = crate::civil::date(days as i64);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The handshake for one dial, and where its failure is kept: lapin sees
/// only an I/O error, and the dial turns this back into the reason.
pub(crate) struct TlsDial {
    connector: TlsConnector,
    server_name: ServerName<'static>,
    failure: Arc<Mutex<Option<rustls::Error>>>,
    /// Whether any application data arrived over this dial's streams.
    received: Arc<AtomicBool>,
}

impl TlsDial {
    /// The last TLS error this dial's streams met: in the handshake, or (a
    /// client certificate refused under TLS 1.3) in the first read after it.
    pub(crate) fn failure(&self) -> Option<rustls::Error> {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn name(&self) -> String {
        self.server_name.to_str().into_owned()
    }

    pub(crate) fn handshake<S>(&self, tcp: S) -> impl std::future::Future<Output = io::Result<Socket<S>>> + Send + 'static
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let connect = self.connector.connect(self.server_name.clone(), tcp);
        let failure = self.failure.clone();
        let received = self.received.clone();
        async move {
            match connect.await {
                Ok(tls) => Ok(Socket::Tls(Box::new(tls), Arc::new(StreamReport { failure, received }))),
                Err(e) => {
                    record(&failure, &e);
                    Err(e)
                }
            }
        }
    }
}

impl Clone for TlsDial {
    fn clone(&self) -> Self {
        TlsDial {
            connector: self.connector.clone(),
            server_name: self.server_name.clone(),
            failure: self.failure.clone(),
            received: self.received.clone(),
        }
    }
}

fn record(failure: &Mutex<Option<rustls::Error>>, e: &io::Error) {
    if let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(tls.clone());
    }
}

/// A broker connection's byte stream: plain TCP for `amqp://`, TLS over it
/// for `amqps://`.
pub(crate) enum Socket<S> {
    Plain(S),
    Tls(Box<TlsStream<S>>, Arc<StreamReport>),
}

/// What a dial's TLS stream reports back to it: its last TLS error, and
/// whether any application data came through.
pub(crate) struct StreamReport {
    failure: Arc<Mutex<Option<rustls::Error>>>,
    received: Arc<AtomicBool>,
}

fn noted<T>(failure: &Mutex<Option<rustls::Error>>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
    if let Poll::Ready(Err(e)) = &r {
        record(failure, e);
    }
    r
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Socket<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Socket::Tls(s, seen) => {
                let r = noted(&seen.failure, Pin::new(s.as_mut()).poll_read(cx, buf));
                if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
                    seen.received.store(true, Ordering::Release);
                }
                r
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Socket<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Socket::Tls(s, seen) => noted(&seen.failure, Pin::new(s.as_mut()).poll_write(cx, buf)),
        }
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Socket::Tls(s, seen) => noted(&seen.failure, Pin::new(s.as_mut()).poll_write_vectored(cx, bufs)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Plain(s) => Pin::new(s).poll_flush(cx),
            Socket::Tls(s, seen) => noted(&seen.failure, Pin::new(s.as_mut()).poll_flush(cx)),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Plain(s) => Pin::new(s).poll_close(cx),
            Socket::Tls(s, seen) => noted(&seen.failure, Pin::new(s.as_mut()).poll_close(cx)),
        }
    }
}

/// `verify: false`: any certificate, any name. The handshake's signatures
/// are still checked (the connection is encrypted to whoever answered), but
/// whoever answered is not known: for tests against a throwaway broker only.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_the_service_installed_is_the_one_used() {
        // Another test may have built a config already: ring's, never an
        // installed one, until something installs one.
        let installed = CryptoProvider::get_default().cloned().unwrap_or_else(|| {
            let _ = ring_provider().as_ref().clone().install_default();
            CryptoProvider::get_default().cloned().expect("installed")
        });
        assert!(Arc::ptr_eq(&provider(), &installed));
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(utc(UnixTime::since_unix_epoch(std::time::Duration::from_secs(0))), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(UnixTime::since_unix_epoch(std::time::Duration::from_secs(951_782_400))), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_700_000_000))), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn names_are_shown_as_written() {
        assert_eq!(plain_name("DnsName(\"localhost\")"), "localhost");
        assert_eq!(plain_name("IpAddress(127.0.0.1)"), "127.0.0.1");
        assert_eq!(plain_name("DirectoryName"), "DirectoryName");
    }

    #[test]
    fn alerts_are_named_as_the_rfc_does() {
        assert_eq!(alert_name(rustls::AlertDescription::CertificateRequired), "certificate_required");
        assert_eq!(alert_name(rustls::AlertDescription::UnknownCA), "unknown_ca");
    }

    #[test]
    fn a_missing_file_is_named() {
        let opts = TlsOptions { ca_file: Some("/nonexistent/ca.pem".into()), ..Default::default() };
        let e = Tls::new(&opts).err().expect("a missing CA file is refused");
        assert_eq!(e.kind(), &ErrorKind::InvalidArgument);
        assert!(e.message().contains("/nonexistent/ca.pem"), "{e}");
        assert!(e.message().contains("ca_file"), "{e}");
    }

    #[test]
    fn a_file_that_is_not_pem_is_named() {
        let dir = std::env::temp_dir().join(format!("acemq-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let e = Tls::new(&TlsOptions { ca_file: Some(path.clone()), ..Default::default() }).err().unwrap();
        assert!(e.message().contains("holds no certificate"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_certificate_needs_its_key() {
        let opts = TlsOptions { cert_file: Some("/tmp/c.pem".into()), verify: false, ..Default::default() };
        let e = Tls::new(&opts).err().unwrap();
        assert!(e.message().contains("cert_file: and key_file: together"), "{e}");
    }

    #[test]
    fn verify_false_needs_no_store() {
        let tls = Tls::new(&TlsOptions { verify: false, ..Default::default() }).unwrap();
        assert_eq!(tls.dial("localhost").unwrap().name(), "localhost");
        assert_eq!(tls.dial("127.0.0.1").unwrap().name(), "127.0.0.1");
    }

    #[test]
    fn failures_name_the_cause_and_the_fix() {
        let tls = Tls::new(&TlsOptions { verify: false, ..Default::default() }).unwrap();
        let e = tls.explain(&rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer), "h:5671/", "h");
        assert_eq!(e.kind(), &ErrorKind::Tls);
        assert!(e.message().contains("not signed by") && e.message().contains("ca_file"), "{e}");
        let e = tls.explain(&rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired), "h:5671/", "h");
        assert!(e.message().contains("cert_file:, key_file:"), "{e}");
    }
}
