//! An https front for a local plain-HTTP endpoint, as hosted Upstash looks to
//! a client: TLS with a certificate for 127.0.0.1, made afresh by `openssl
//! req` and trusted only by a client told to (`SSL_CERT_FILE`).

use std::{
    io::{ErrorKind, Read, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use edge_limiter_local::testenv::Scratch;
use native_tls::{Identity, TlsAcceptor, TlsStream};

/// TLS on a loopback port, each connection piped to a plain TCP address;
/// stops accepting when dropped.
pub struct TlsFront {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The certificate's PEM file, for `SSL_CERT_FILE`.
    pub cert: PathBuf,
    stop: Arc<AtomicBool>,
    _dir: Scratch,
}

impl TlsFront {
    /// A front for `backend` (`127.0.0.1:PORT`).
    pub fn start(backend: &str) -> TlsFront {
        let dir = Scratch::new("tls");
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", "/CN=127.0.0.1"])
            .args(["-addext", "subjectAltName=IP:127.0.0.1"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl runs");
        assert!(made.status.success(), "openssl req: {made:?}");
        let identity = Identity::from_pkcs8(
            &std::fs::read(&cert).unwrap(),
            &std::fs::read(&key).unwrap(),
        )
        .expect("a PKCS#8 key and its certificate");
        let acceptor = Arc::new(TlsAcceptor::new(identity).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let (stopped, backend) = (stop.clone(), backend.to_owned());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let (acceptor, backend) = (acceptor.clone(), backend.clone());
                std::thread::spawn(move || {
                    // A client that rejects the certificate ends here.
                    if let (Ok(tls), Ok(plain)) =
                        (acceptor.accept(client), TcpStream::connect(&backend))
                    {
                        pipe(tls, plain);
                    }
                });
            }
        });
        TlsFront {
            url,
            cert,
            stop,
            _dir: dir,
        }
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accepting thread so that it sees the flag.
        let _ = TcpStream::connect(self.url.trim_start_matches("https://"));
    }
}

/// Copies bytes both ways until either side closes. A TLS stream cannot be
/// split between two threads, so one thread takes turns, each read waiting
/// a moment at most.
fn pipe(mut tls: TlsStream<TcpStream>, mut plain: TcpStream) {
    let turn = Some(Duration::from_millis(2));
    if tls.get_ref().set_read_timeout(turn).is_err() || plain.set_read_timeout(turn).is_err() {
        return;
    }
    let mut buf = [0u8; 16 * 1024];
    while relay(&mut tls, &mut plain, &mut buf) && relay(&mut plain, &mut tls, &mut buf) {}
}

/// Copies what `from` gives within its turn to `to`; false once either
/// side is done.
fn relay(from: &mut impl Read, to: &mut impl Write, buf: &mut [u8]) -> bool {
    match from.read(buf) {
        Ok(0) => false,
        Ok(n) => to.write_all(&buf[..n]).is_ok(),
        Err(e) => waited(e.kind()),
    }
}

/// A read that found nothing within its turn.
fn waited(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::WouldBlock | ErrorKind::TimedOut)
}
