//! TLS material: a throwaway certificate authority with a server and a client certificate,
//! and the `redis-server` options that serve TLS with them.

use std::path::PathBuf;

use crate::process::unique_dir;

/// A throwaway certificate authority, with a server certificate (for `127.0.0.1`, `::1` and
/// `localhost`) and a client certificate signed by it, as PEM files in a private temporary
/// directory that is removed on drop. Generated with `rcgen` (ECDSA P-256); valid from 1975
/// to 4096, so never expired in a test.
#[derive(Debug)]
pub struct TestCerts {
    dir: PathBuf,
    ca_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

impl TestCerts {
    /// Generates a CA and its two certificates, and writes them to files.
    pub fn generate() -> TestCerts {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "coord test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign the CA");
        let issuer = Issuer::new(ca_params, ca_key);

        let leaf = |names: Vec<String>, cn: &str, usage: &[ExtendedKeyUsagePurpose]| {
            let mut params = CertificateParams::new(names).expect("certificate params");
            params.distinguished_name.push(DnType::CommonName, cn);
            params.use_authority_key_identifier_extension = true;
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = usage.to_vec();
            let key = KeyPair::generate().expect("leaf key");
            let cert = params.signed_by(&key, &issuer).expect("sign a leaf");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".into(), "::1".into(), "localhost".into()],
            "localhost",
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                // Servers present it on their own outgoing connections too.
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        let (client_cert, client_key) = leaf(
            vec!["coord-test-client".into()],
            "coord-test-client",
            &[ExtendedKeyUsagePurpose::ClientAuth],
        );
        let dir = unique_dir("certs");
        let certs = TestCerts {
            dir,
            ca_pem: ca_cert.pem(),
            client_cert_pem: client_cert,
            client_key_pem: client_key,
        };
        for (name, text) in [
            ("ca.crt", certs.ca_pem.as_str()),
            ("server.crt", server_cert.as_str()),
            ("server.key", server_key.as_str()),
            ("client.crt", certs.client_cert_pem.as_str()),
            ("client.key", certs.client_key_pem.as_str()),
        ] {
            std::fs::write(certs.dir.join(name), text).expect("write a test certificate");
        }
        certs
    }

    /// The CA certificate's file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The server certificate's file.
    pub fn server_cert_file(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// The server key's file.
    pub fn server_key_file(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// The client certificate's file.
    pub fn client_cert_file(&self) -> PathBuf {
        self.dir.join("client.crt")
    }

    /// The client key's file.
    pub fn client_key_file(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// The client certificate, PEM.
    pub fn client_cert_pem(&self) -> &str {
        &self.client_cert_pem
    }

    /// The client key, PEM (PKCS#8).
    pub fn client_key_pem(&self) -> &str {
        &self.client_key_pem
    }

    /// How a server serves TLS with these certificates, requiring a client certificate
    /// signed by the CA when `client_auth`.
    pub(crate) fn serving(&self, client_auth: bool) -> TlsServing {
        TlsServing {
            args: self.server_args(client_auth),
            client_auth,
            ca: self.ca_file(),
        }
    }

    /// `redis-server` options serving TLS with these certificates (the port aside),
    /// requiring a client certificate signed by the CA when `client_auth`. The server
    /// certificate also serves as the client certificate of the server's own outgoing
    /// connections (replication, cluster bus, Sentinel).
    fn server_args(&self, client_auth: bool) -> Vec<String> {
        vec![
            "--tls-cert-file".into(),
            self.server_cert_file().display().to_string(),
            "--tls-key-file".into(),
            self.server_key_file().display().to_string(),
            "--tls-ca-cert-file".into(),
            self.ca_file().display().to_string(),
            "--tls-auth-clients".into(),
            if client_auth { "yes" } else { "no" }.into(),
        ]
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How a server (or Sentinel) serves TLS: its options, bar the port, which is chosen at
/// launch.
#[derive(Debug, Clone)]
pub(crate) struct TlsServing {
    /// `redis-server` options as `--name value` pairs (a Sentinel writes them into its
    /// configuration file without the dashes).
    pub(crate) args: Vec<String>,
    /// Whether clients must present a certificate signed by the CA.
    pub(crate) client_auth: bool,
    /// The CA certificate's file.
    pub(crate) ca: PathBuf,
}
