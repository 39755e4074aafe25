//! A TCP proxy that cuts a connection after some bytes: a path lost mid-transfer, exactly
//! where the test says.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

/// Forwards connections to `upstream`; the first connection is cut (both directions,
/// abruptly) once `cut_after` bytes went from client to target (or, with
/// [`CuttingProxy::start_on_replies`], from target to client). Later connections pass.
pub struct CuttingProxy {
    pub portal: String,
    pub cuts: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl CuttingProxy {
    pub fn start(upstream: String, cut_after: usize) -> CuttingProxy {
        Self::start_counting(upstream, cut_after, false)
    }

    /// Like [`CuttingProxy::start`], but counts the bytes from the target to the client:
    /// the cut then falls among answers the target has sent, in the middle of a read.
    pub fn start_on_replies(upstream: String, cut_after: usize) -> CuttingProxy {
        Self::start_counting(upstream, cut_after, true)
    }

    fn start_counting(upstream: String, cut_after: usize, replies: bool) -> CuttingProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let portal = l.local_addr().unwrap().to_string();
        let cuts = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (cuts2, stop2) = (cuts.clone(), stop.clone());
        let armed = Arc::new(AtomicBool::new(true));
        thread::spawn(move || {
            for c in l.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(c) = c else { continue };
                let Ok(u) = TcpStream::connect(&upstream) else {
                    continue;
                };
                // Only the first connection that carries enough bytes is cut (not the
                // first one: auto-tuning's RTT probe connects and goes).
                let limit = armed.load(Ordering::Acquire).then_some(cut_after);
                let (c2, u2) = (c.try_clone().unwrap(), u.try_clone().unwrap());
                let (c3, u3) = (c.try_clone().unwrap(), u.try_clone().unwrap());
                let cut = Some((c3, u3, cuts2.clone(), armed.clone()));
                if replies {
                    thread::spawn(move || pump(c, u, None, None));
                    thread::spawn(move || pump(u2, c2, limit, cut));
                } else {
                    thread::spawn(move || pump(c, u, limit, cut));
                    thread::spawn(move || pump(u2, c2, None, None));
                }
            }
        });
        CuttingProxy { portal, cuts, stop }
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(&self.portal);
    }
}

type Cut = (TcpStream, TcpStream, Arc<AtomicUsize>, Arc<AtomicBool>);

fn pump(mut from: TcpStream, mut to: TcpStream, limit: Option<usize>, cut: Option<Cut>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0usize;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        total += n;
        if limit.is_some_and(|l| total >= l) {
            match &cut {
                Some((a, b, cuts, armed)) if armed.swap(false, Ordering::AcqRel) => {
                    cuts.fetch_add(1, Ordering::SeqCst);
                    let _ = a.shutdown(Shutdown::Both);
                    let _ = b.shutdown(Shutdown::Both);
                    break;
                }
                // Another connection was cut already: this one carries on.
                _ => continue,
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
