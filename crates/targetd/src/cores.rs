//! Where connections run: single-threaded runtimes, one thread each ("cores"), so that a
//! connection's reader, writer and the commands it runs inline stay on one thread and
//! wake each other without crossing to another. On tokio's shared multi-thread scheduler
//! a connection's tasks hopped between its workers: with four connections in a session,
//! 4 KiB reads fell to about 0.6 of one connection's rate with neither side busy.
//!
//! A connection goes to its session's core when its login names a session (a TSIH) that
//! has one; otherwise to the core with the fewest connections. Commands that may block
//! (`spawn_blocking`) still go to the blocking pool of the connection's runtime.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    /// The index of the core this thread is, if it is one.
    static HOME: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The core the calling thread is, if it is one.
pub(crate) fn current() -> Option<usize> {
    HOME.with(|h| h.get())
}

/// The running cores, stopped by dropping their [`Stop`].
pub(crate) struct Cores {
    cores: Vec<Core>,
}

struct Core {
    handle: Handle,
    /// Connections placed here and not finished.
    load: Arc<AtomicUsize>,
}

/// Stops the cores when dropped: each one's tasks are dropped, and its blocking workers
/// get a moment to end.
pub(crate) struct Stop(Vec<oneshot::Sender<()>>);

impl Drop for Stop {
    fn drop(&mut self) {
        for core in self.0.drain(..) {
            let _ = core.send(());
        }
    }
}

/// A connection counted on its core until dropped.
pub(crate) struct Placed(Arc<AtomicUsize>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Cores {
    /// Starts `n` cores (at least one).
    pub(crate) fn start(n: usize) -> std::io::Result<(Cores, Stop)> {
        let mut cores = Vec::new();
        let mut stops = Vec::new();
        for i in 0..n.max(1) {
            let (stop, stopped) = oneshot::channel::<()>();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name(format!("rsv-core{i}"))
                .spawn(move || {
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    HOME.with(|h| h.set(Some(i)));
                    let _ = tx.send(Ok(rt.handle().clone()));
                    rt.block_on(async {
                        let _ = stopped.await;
                    });
                    rt.shutdown_timeout(Duration::from_millis(100));
                })?;
            let handle = rx
                .recv()
                .map_err(|_| std::io::Error::other("a core's thread ended at its start"))??;
            cores.push(Core {
                handle,
                load: Arc::default(),
            });
            stops.push(stop);
        }
        Ok((Cores { cores }, Stop(stops)))
    }

    /// Whether every core runs a task within `within`: none is stuck.
    pub(crate) async fn alive(&self, within: Duration) -> bool {
        let probes: Vec<_> = self
            .cores
            .iter()
            .map(|c| c.handle.spawn(async {}))
            .collect();
        tokio::time::timeout(within, async {
            for p in probes {
                if p.await.is_err() {
                    return false;
                }
            }
            true
        })
        .await
        .unwrap_or(false)
    }

    /// Runs a new connection's future on core `home` when given (and valid), else on the
    /// least busy core. `make` runs on the chosen core, inside its runtime (a socket
    /// registered there is served by its thread), and gets the connection's count.
    pub(crate) fn spawn<F, Fut>(&self, home: Option<usize>, make: F)
    where
        F: FnOnce(Placed) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let i = home.filter(|&i| i < self.cores.len()).unwrap_or_else(|| {
            (0..self.cores.len())
                .min_by_key(|&i| self.cores[i].load.load(Ordering::Acquire))
                .unwrap_or(0)
        });
        let core = &self.cores[i];
        core.load.fetch_add(1, Ordering::AcqRel);
        let placed = Placed(core.load.clone());
        // Built on the core: a socket registered in `make` is served by the core's thread.
        drop(core.handle.spawn(async move { make(placed).await }));
    }
}
