//! Certificates made at test time with rcgen: a CA, a server certificate for `localhost` and `127.0.0.1`, and
//! client certificates with chosen DNS names, written as PEM files.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A test CA that signs server and client certificates.
pub struct TestCa {
    cert: Certificate,
    key: KeyPair,
    /// The CA certificate's PEM file.
    pub ca_file: PathBuf,
    dir: PathBuf,
}

/// A certificate and its key, as PEM files.
pub struct Issued {
    /// Certificate chain file (leaf only).
    pub cert_file: PathBuf,
    /// Private key file.
    pub key_file: PathBuf,
}

impl TestCa {
    /// Makes a CA named `name` and writes `<name>-ca.crt` under `dir`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("ca key");
        let cert = p.self_signed(&key).expect("ca cert");
        let ca_file = dir.join(format!("{name}-ca.crt"));
        std::fs::write(&ca_file, cert.pem()).expect("write ca");
        TestCa { cert, key, ca_file, dir: dir.to_path_buf() }
    }

    fn issue(&self, file: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Issued {
        let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
        p.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("client"));
        p.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.cert, &self.key).expect("sign");
        let cert_file = self.dir.join(format!("{file}.crt"));
        let key_file = self.dir.join(format!("{file}.key"));
        std::fs::write(&cert_file, cert.pem()).expect("write cert");
        std::fs::write(&key_file, key.serialize_pem()).expect("write key");
        Issued { cert_file, key_file }
    }

    /// A server certificate for `localhost` and `127.0.0.1`, written as `<file>.crt` / `<file>.key`.
    pub fn server(&self, file: &str) -> Issued {
        self.issue(file, &["localhost", "127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A server certificate for these DNS names (for example a Kubernetes Service name).
    pub fn server_for(&self, file: &str, names: &[&str]) -> Issued {
        self.issue(file, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate with these DNS names.
    pub fn client(&self, file: &str, names: &[&str]) -> Issued {
        self.issue(file, names, ExtendedKeyUsagePurpose::ClientAuth)
    }
}
