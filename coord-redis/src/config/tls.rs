//! Certificates for TLS connections: as the builder was given them ([`TlsOptions`]), loaded
//! and checked ([`TlsMaterial`]), and in rustls's form.

use std::fmt;
use std::path::PathBuf;

use coord_core::BackendError;

use super::config_error;

/// PEM text, given directly or read from a file when the provider connects.
#[derive(Clone)]
#[cfg_attr(not(feature = "tls"), allow(dead_code))] // the builder sets it only with TLS
pub(crate) enum Pem {
    Text(Vec<u8>),
    File(PathBuf),
}

impl Pem {
    fn load(&self, what: &str) -> Result<Vec<u8>, BackendError> {
        match self {
            Pem::Text(bytes) => Ok(bytes.clone()),
            Pem::File(path) => std::fs::read(path).map_err(|e| {
                config_error(format!("reading the {what} from {}: {e}", path.display()))
            }),
        }
    }
}

/// Certificates for TLS connections, as the builder was given them.
#[derive(Clone, Default)]
pub(crate) struct TlsOptions {
    /// Trust only these CAs (instead of the system's store).
    pub(crate) ca: Option<Pem>,
    /// A client certificate (chain) and its private key.
    pub(crate) client: Option<(Pem, Pem)>,
}

impl TlsOptions {
    pub(crate) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }

    /// Reads the files and checks that each holds what it should.
    pub(crate) fn load(&self) -> Result<TlsMaterial, BackendError> {
        let material = TlsMaterial {
            ca: self.ca.as_ref().map(|p| p.load("TLS CA")).transpose()?,
            client: match &self.client {
                Some((cert, key)) => Some((
                    cert.load("TLS client certificate")?,
                    key.load("TLS client key")?,
                )),
                None => None,
            },
        };
        material.check()?;
        Ok(material)
    }
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |p: &Pem| match p {
            Pem::Text(_) => "<PEM given>".to_owned(),
            Pem::File(path) => path.display().to_string(),
        };
        f.debug_struct("TlsOptions")
            .field("ca", &self.ca.as_ref().map(shown))
            .field(
                "client_cert",
                &self.client.as_ref().map(|(cert, _)| shown(cert)),
            )
            .finish()
    }
}

/// Loaded PEM bytes for TLS connections. Never printed.
#[derive(Clone, Default)]
pub(crate) struct TlsMaterial {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl TlsMaterial {
    #[cfg(not(feature = "tls"))]
    fn check(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Every given PEM holds what it should: the CA at least one certificate, the client
    /// certificate at least one and the key a private key.
    #[cfg(feature = "tls")]
    fn check(&self) -> Result<(), BackendError> {
        if let Some(ca) = &self.ca {
            roots_from_pem(ca)?;
        }
        if let Some((cert, key)) = &self.client {
            client_identity(cert, key)?;
        }
        Ok(())
    }

    /// A rustls client configuration with these certificates (the system's roots when no CA
    /// was given), on ring, whatever provider the process has installed.
    #[cfg(feature = "tls")]
    #[allow(dead_code)] // used by the fred transport only
    pub(crate) fn rustls_config(&self) -> Result<rustls::ClientConfig, BackendError> {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| config_error(format!("TLS setup: {e}")))?;
        let roots = match &self.ca {
            Some(ca) => roots_from_pem(ca)?,
            None => system_roots()?,
        };
        let builder = builder.with_root_certificates(roots);
        match &self.client {
            Some((cert, key)) => {
                let (chain, key) = client_identity(cert, key)?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| config_error(format!("the TLS client certificate: {e}")))
            }
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// Makes sure rustls has a process-wide crypto provider before a client library asks for
/// it: ring's, unless the application installed one. (rustls picks one by itself only when
/// exactly one is compiled in; with two, a library that asks would panic.)
#[cfg(feature = "tls")]
#[allow(dead_code)] // used by the redis-rs transport only
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: one provider is in place either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(feature = "tls")]
fn roots_from_pem(pem: &[u8]) -> Result<rustls::RootCertStore, BackendError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| config_error(format!("the TLS CA is not valid PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| config_error(format!("the TLS CA certificate is refused: {e}")))?;
    }
    if roots.is_empty() {
        return Err(config_error(
            "the TLS CA holds no certificate (expected PEM `BEGIN CERTIFICATE` blocks)".to_owned(),
        ));
    }
    Ok(roots)
}

#[cfg(feature = "tls")]
#[allow(dead_code)] // used by the fred transport only
fn system_roots() -> Result<rustls::RootCertStore, BackendError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), |e| e.to_string());
        return Err(config_error(format!(
            "no trusted CA certificates in the system store ({why}): install them, or name the \
             CA with `tls_ca_file`"
        )));
    }
    Ok(roots)
}

#[cfg(feature = "tls")]
type Identity = (
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
);

#[cfg(feature = "tls")]
fn client_identity(cert: &[u8], key: &[u8]) -> Result<Identity, BackendError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| config_error(format!("the TLS client certificate is not valid PEM: {e}")))?;
    if chain.is_empty() {
        return Err(config_error(
            "the TLS client certificate holds no certificate".to_owned(),
        ));
    }
    // The key's own text never goes into a message.
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|_| config_error("the TLS client key holds no PEM private key".to_owned()))?;
    Ok((chain, key))
}

#[cfg(test)]
mod tests {
    use coord_core::provider::BackendErrorKind;

    use super::*;

    #[test]
    fn bad_pem_is_refused_without_quoting_it() {
        let tls = TlsOptions {
            ca: Some(Pem::Text(b"not a certificate".to_vec())),
            client: None,
        };
        assert_eq!(tls.load().unwrap_err().kind(), BackendErrorKind::Config);
        let tls = TlsOptions {
            ca: Some(Pem::File("/nonexistent/ca.pem".into())),
            client: None,
        };
        let err = tls.load().unwrap_err();
        assert!(err.message().contains("/nonexistent/ca.pem"), "{err}");
        let tls = TlsOptions {
            ca: None,
            client: Some((
                Pem::Text(b"no cert".to_vec()),
                Pem::Text(b"secret-key-text".to_vec()),
            )),
        };
        let err = tls.load().unwrap_err();
        assert!(!err.message().contains("secret-key-text"), "{err}");
    }
}
