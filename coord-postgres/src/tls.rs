//! TLS for connections: rustls with ring, verifying the server's certificate chain and host
//! name against the system's roots or the CAs of a file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;

/// Where trusted roots (and an optional client certificate) come from.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsSettings {
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) client_cert: Option<(PathBuf, PathBuf)>,
}

fn config_error(message: String) -> BackendError {
    BackendError::new(BackendErrorKind::Config, message)
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, BackendError> {
    std::fs::read(path)
        .map_err(|e| config_error(format!("reading the {what} {}: {e}", path.display())))
}

/// The connector for `settings`.
pub(crate) fn connector(
    settings: &TlsSettings,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, BackendError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let mut roots = rustls::RootCertStore::empty();
    match &settings.ca_file {
        Some(path) => {
            let pem = read(path, "CA file")?;
            let mut found = 0;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| {
                    config_error(format!("the CA file {} is not PEM: {e}", path.display()))
                })?;
                roots.add(cert).map_err(|e| {
                    config_error(format!(
                        "a certificate in the CA file {} is not usable: {e}",
                        path.display()
                    ))
                })?;
                found += 1;
            }
            if found == 0 {
                return Err(config_error(format!(
                    "the CA file {} holds no PEM certificate",
                    path.display()
                )));
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(format!("TLS setup: {e}")))?
        .with_root_certificates(roots);
    let config = match &settings.client_cert {
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(&read(cert, "client certificate")?)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    config_error(format!(
                        "the client certificate {} is not PEM: {e}",
                        cert.display()
                    ))
                })?;
            let key = PrivateKeyDer::from_pem_slice(&read(key, "client key")?).map_err(|_| {
                config_error(format!(
                    "the client key {} holds no PEM private key",
                    key.display()
                ))
            })?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| config_error(format!("the client certificate is not usable: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}
