//! TLS for the server (rustls with the aws-lc-rs provider): certificate
//! files, optional client certificates (mutual TLS), reload on SIGHUP.
//!
//! The server's rustls configuration is built from PEM files named by
//! [`TlsSettings`]:
//!
//! - `cert`: the certificate chain, leaf first;
//! - `key`: the private key (PKCS#8, PKCS#1 or SEC1), which must match the
//!   leaf certificate;
//! - `client_ca` (optional): the CA bundle that client certificates must
//!   chain to. With it the server asks every client for a certificate and
//!   verifies any it gets ([`ClientAuth::Optional`]: a client without one
//!   is still served and authenticates by API key; [`ClientAuth::Required`]:
//!   the handshake of a client without a valid certificate fails).
//!
//! ALPN offers `h2` (when HTTP/2 is on) and `http/1.1`.
//!
//! [`TlsReloader`] holds the current configuration behind a lock; the
//! connection layer takes a snapshot for each new handshake, so a reload
//! (on SIGHUP, see [`crate::serve_router`]) affects new connections only
//! and never drops existing ones. A reload that fails (unreadable file,
//! key not matching the certificate, ...) leaves the previous
//! configuration in place.
//!
//! Every error names the file's role (`TLS certificate file`, `TLS private
//! key file`, `TLS client CA file`) and path.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use store_ops::auth::ClientCert;

/// Whether clients must present a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// A certificate is verified if presented; API keys still work.
    Optional,
    /// Every connection must present a certificate signed by the CA.
    Required,
}

/// The server's TLS files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA bundle that client certificates must chain to (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: optional or required.
    pub client_auth: ClientAuth,
}

/// The live TLS configuration of a server: built from [`TlsSettings`],
/// swapped whole by [`TlsReloader::reload`].
#[derive(Debug)]
pub struct TlsReloader {
    settings: TlsSettings,
    http2: bool,
    current: RwLock<Arc<ServerConfig>>,
}

impl TlsReloader {
    /// Reads and checks the files of `settings`. `http2` adds `h2` to the
    /// ALPN protocols.
    ///
    /// Fails with an `io::Error` naming the file's role and path when a
    /// file is missing, unreadable or invalid, or when the key does not
    /// match the certificate.
    pub fn load(settings: TlsSettings, http2: bool) -> io::Result<Self> {
        let config = build_config(&settings, http2)?;
        Ok(TlsReloader {
            settings,
            http2,
            current: RwLock::new(Arc::new(config)),
        })
    }

    /// Re-reads the files. On success new handshakes use the new
    /// configuration (existing connections are untouched); on failure the
    /// previous configuration stays in force and the error is returned.
    pub fn reload(&self) -> io::Result<()> {
        let config = Arc::new(build_config(&self.settings, self.http2)?);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = config;
        Ok(())
    }

    /// The configuration new handshakes use.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// An acceptor over the current configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config())
    }
}

fn file_error(role: &str, path: &Path, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{role}: {}: {e}", path.display()),
    )
}

fn read_certs(role: &str, path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(role, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(role, path, e))?;
    if certs.is_empty() {
        return Err(file_error(role, path, "no PEM certificate found"));
    }
    Ok(certs)
}

/// Builds the rustls server configuration of `settings`.
fn build_config(settings: &TlsSettings, http2: bool) -> io::Result<ServerConfig> {
    const CERT: &str = "TLS certificate file";
    const KEY: &str = "TLS private key file";
    const CA: &str = "TLS client CA file";

    let provider: Arc<CryptoProvider> = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let certs = read_certs(CERT, &settings.cert)?;
    let key = PrivateKeyDer::from_pem_file(&settings.key).map_err(|e| {
        let e = match e {
            rustls_pki_types::pem::Error::NoItemsFound => "no PEM private key found".to_string(),
            e => e.to_string(),
        };
        file_error(KEY, &settings.key, e)
    })?;

    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| io::Error::other(format!("TLS: {e}")))?;
    let builder = match &settings.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(CA, ca)? {
                roots.add(cert).map_err(|e| file_error(CA, ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match settings.client_auth {
                ClientAuth::Optional => verifier.allow_unauthenticated(),
                ClientAuth::Required => verifier,
            };
            let verifier = verifier.build().map_err(|e| file_error(CA, ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "TLS certificate file {} with private key file {}: {e}",
                settings.cert.display(),
                settings.key.display()
            ),
        )
    })?;
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(config)
}

/// The names of a (verified) client certificate. A certificate that does
/// not parse yields no names.
pub(crate) fn client_cert_names(der: &CertificateDer<'_>) -> ClientCert {
    let mut names = ClientCert {
        common_name: None,
        dns_names: Vec::new(),
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der.as_ref()) else {
        return names;
    };
    names.common_name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string);
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                names.dns_names.push((*dns).to_string());
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, Issuer, KeyPair};

    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }
        fn write(&self, name: &str, text: &str) {
            std::fs::write(self.path(name), text).unwrap();
        }
        fn settings(&self, ca: bool) -> TlsSettings {
            TlsSettings {
                cert: self.path("cert.pem"),
                key: self.path("key.pem"),
                client_ca: ca.then(|| self.path("ca.pem")),
                client_auth: ClientAuth::Required,
            }
        }
    }

    /// A CA, a server certificate signed by it, and a client certificate.
    fn files(server_cn: &str) -> Files {
        let dir = tempfile::tempdir().unwrap();
        let f = Files { dir };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, server_cn);
        let cert = params.signed_by(&key, &issuer).unwrap();
        f.write("ca.pem", &ca.pem());
        f.write("cert.pem", &cert.pem());
        f.write("key.pem", &key.serialize_pem());
        let ckey = KeyPair::generate().unwrap();
        let mut cparams =
            CertificateParams::new(vec!["client.example".to_string(), "c2.example".to_string()])
                .unwrap();
        cparams.distinguished_name.push(DnType::CommonName, "alice");
        let ccert = cparams.signed_by(&ckey, &issuer).unwrap();
        f.write("client.pem", &ccert.pem());
        f
    }

    #[test]
    fn loads_and_names_file_roles_in_errors() {
        let f = files("server one");
        let r = TlsReloader::load(f.settings(true), true).unwrap();
        assert_eq!(r.config().alpn_protocols[0], b"h2");
        let r = TlsReloader::load(f.settings(false), false).unwrap();
        assert_eq!(r.config().alpn_protocols, vec![b"http/1.1".to_vec()]);

        let mut s = f.settings(true);
        s.cert = f.path("missing.pem");
        let e = TlsReloader::load(s, true).unwrap_err().to_string();
        assert!(e.starts_with("TLS certificate file: "), "{e}");
        assert!(e.contains("missing.pem"), "{e}");

        f.write("garbage.pem", "not a pem file\n");
        let mut s = f.settings(true);
        s.key = f.path("garbage.pem");
        let e = TlsReloader::load(s, true).unwrap_err().to_string();
        assert!(e.starts_with("TLS private key file: "), "{e}");

        let mut s = f.settings(true);
        s.client_ca = Some(f.path("garbage.pem"));
        let e = TlsReloader::load(s, true).unwrap_err().to_string();
        assert!(e.starts_with("TLS client CA file: "), "{e}");

        // A key that does not match the certificate.
        let other = KeyPair::generate().unwrap();
        f.write("other-key.pem", &other.serialize_pem());
        let mut s = f.settings(false);
        s.key = f.path("other-key.pem");
        let e = TlsReloader::load(s, false).unwrap_err().to_string();
        assert!(e.contains("private key"), "{e}");
    }

    #[test]
    fn reload_swaps_the_config_and_a_failed_reload_keeps_the_old_one() {
        let f = files("server one");
        let r = TlsReloader::load(f.settings(true), true).unwrap();
        let first = r.config();
        // New files: a reload swaps the configuration.
        let g = files("server two");
        for name in ["cert.pem", "key.pem", "ca.pem"] {
            std::fs::copy(g.path(name), f.path(name)).unwrap();
        }
        r.reload().unwrap();
        let second = r.config();
        assert!(!Arc::ptr_eq(&first, &second));
        // A broken file: the reload fails and the configuration stays.
        f.write("cert.pem", "garbage\n");
        let e = r.reload().unwrap_err().to_string();
        assert!(e.starts_with("TLS certificate file: "), "{e}");
        assert!(Arc::ptr_eq(&second, &r.config()));
    }

    #[test]
    fn client_cert_names_reads_cn_and_dns_sans() {
        let f = files("server");
        let der = CertificateDer::from_pem_file(f.path("client.pem")).unwrap();
        let names = client_cert_names(&der);
        assert_eq!(names.common_name.as_deref(), Some("alice"));
        assert_eq!(names.dns_names, vec!["client.example", "c2.example"]);
        let junk = CertificateDer::from(vec![1u8, 2, 3]);
        assert_eq!(client_cert_names(&junk).common_name, None);
    }
}
