//! Certificates for the TLS tests, made with the openssl command line as an operator would
//! (docs/tls.md): a root CA, an intermediate CA, node certificates for 127.0.0.1 signed by the
//! intermediate (served with it as their chain), and nodes signed by a CA of their own.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{prerequisite, tool};

/// A root CA, an intermediate, and node certificates under `dir`.
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    pub fn new(dir: &Path) -> Pki {
        prerequisite("openssl (Debian package `openssl`)", tool("openssl"));
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        pki.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "root.key",
            "-out",
            "root.crt",
            "-days",
            "30",
            "-subj",
            "/CN=tarq test root",
        ]);
        std::fs::write(
            dir.join("ca.ext"),
            "basicConstraints=critical,CA:TRUE,pathlen:0\nkeyUsage=critical,keyCertSign,cRLSign\n",
        )
        .unwrap();
        pki.sign("intermediate", "root", "ca.ext");
        std::fs::write(
            dir.join("node.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .unwrap();
        pki
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `name.key` and `name.crt` (subject CN=name) signed by `ca`, with extensions `ext`.
    fn sign(&self, name: &str, ca: &str, ext: &str) {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "30",
            "-extfile",
            ext,
        ]);
    }

    /// A node's certificate and key as a server serves them: `name.chain` holds its
    /// certificate, then the intermediate's.
    pub fn node(&self, name: &str) -> (PathBuf, PathBuf) {
        self.sign(name, "intermediate", "node.ext");
        let mut chain = std::fs::read(self.dir.join(format!("{name}.crt"))).unwrap();
        chain.extend(std::fs::read(self.dir.join("intermediate.crt")).unwrap());
        let path = self.dir.join(format!("{name}.chain"));
        std::fs::write(&path, chain).unwrap();
        (path, self.dir.join(format!("{name}.key")))
    }

    /// A node certificate signed by a CA of its own (not the cluster's): `name.chain`, `name.key`.
    pub fn foreign_node(&self, name: &str) -> (PathBuf, PathBuf) {
        let ca = format!("{name}-ca");
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.crt"),
            "-days",
            "30",
            "-subj",
            "/CN=another CA",
        ]);
        self.sign(name, &ca, "node.ext");
        let path = self.dir.join(format!("{name}.chain"));
        std::fs::copy(self.dir.join(format!("{name}.crt")), &path).unwrap();
        (path, self.dir.join(format!("{name}.key")))
    }

    /// What clients trust: the root alone.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("root.crt")
    }
}
