//! Sets of `Backstore` methods written once for the stores that answer them alike.
//!
//! [`crate::forward!`]: a wrapper ([`crate::Imaged`], [`crate::Tracked`], and the stores of
//! `scsi`'s tests that slow down or count one call) adds its work to some calls and passes
//! the others to the store it wraps unchanged; a method it names is passed through as the
//! trait declares it. A wrapper keeps to itself what it changes (its size, its
//! description, an asynchronous write) by writing that method and leaving it out of the
//! list.
//!
//! [`in_memory!`]: a store whose bytes are in this process's memory ([`crate::RamBackstore`],
//! [`crate::NullBackstore`]) never waits on a read and lends its own memory.

/// Inside `impl Backstore for W`, where `W` has a field `inner` holding the store it wraps
/// (any type with `Backstore`'s methods): `forward! { inner => read_at, flush, … }` writes
/// each named method as a call of the same method of `self.inner`. `changes` writes
/// `write_at`, `discard` and `write_zeroes` as the inner call run inside `W`'s own
/// `fn change(&self, offset, len, op)`, which does the wrapper's work around the write (a
/// unit copied aside, a unit marked changed); `changes_compare_and_write` writes
/// `compare_and_write` the same way (the wrapper's work done before the compare, whatever
/// it finds).
#[macro_export]
macro_rules! forward {
    ($inner:ident => $($method:ident),* $(,)?) => {
        $($crate::forward!(@ $inner $method);)*
    };
    (@ $inner:ident changes) => {
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            self.change(offset, buf.len() as u64, || self.$inner.write_at(buf, offset))
        }

        fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
            self.change(offset, len, || self.$inner.discard(offset, len))
        }

        fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()> {
            self.change(offset, len, || self.$inner.write_zeroes(offset, len))
        }
    };
    (@ $inner:ident cluster_reservations) => {
        fn cluster_reservations(
            &self,
        ) -> Option<std::sync::Arc<dyn $crate::ClusterReservations>> {
            self.$inner.cluster_reservations()
        }
    };
    (@ $inner:ident port_groups) => {
        fn port_groups(
            &self,
            own: u16,
            peers: &[u16],
        ) -> std::io::Result<Option<std::sync::Arc<dyn $crate::groups::PortGroups>>> {
            self.$inner.port_groups(own, peers)
        }
    };
    (@ $inner:ident atomic_compare_and_write_unit) => {
        fn atomic_compare_and_write_unit(&self) -> Option<u64> {
            self.$inner.atomic_compare_and_write_unit()
        }
    };
    (@ $inner:ident changes_compare_and_write) => {
        fn compare_and_write(
            &self,
            offset: u64,
            verify: &[u8],
            write: &[u8],
        ) -> std::io::Result<$crate::Compared> {
            let mut out = $crate::Compared::Written;
            self.change(offset, verify.len() as u64, || {
                out = self.$inner.compare_and_write(offset, verify, write)?;
                Ok(())
            })?;
            Ok(out)
        }
    };
    (@ $inner:ident size) => {
        fn size(&self) -> u64 {
            self.$inner.size()
        }
    };
    (@ $inner:ident announce_reset) => {
        fn announce_reset(&self) -> std::io::Result<()> {
            self.$inner.announce_reset()
        }
    };
    (@ $inner:ident on_peer_reset) => {
        fn on_peer_reset(&self, f: std::sync::Arc<dyn Fn() + Send + Sync>) {
            self.$inner.on_peer_reset(f)
        }
    };
    (@ $inner:ident read_at) => {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.$inner.read_at(buf, offset)
        }
    };
    (@ $inner:ident try_read_at) => {
        fn try_read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<bool> {
            self.$inner.try_read_at(buf, offset)
        }
    };
    (@ $inner:ident reads_async) => {
        fn reads_async(&self) -> bool {
            self.$inner.reads_async()
        }
    };
    (@ $inner:ident read_async) => {
        fn read_async(&self, buf: $crate::buffers::Buf, offset: u64, done: $crate::ReadDone) {
            self.$inner.read_async(buf, offset, done)
        }
    };
    (@ $inner:ident reads_lent_async) => {
        fn reads_lent_async(&self, len: usize) -> bool {
            self.$inner.reads_lent_async(len)
        }
    };
    (@ $inner:ident read_lent_async) => {
        fn read_lent_async(&self, offset: u64, len: usize, done: $crate::LentDone) {
            self.$inner.read_lent_async(offset, len, done)
        }
    };
    (@ $inner:ident writes_async) => {
        fn writes_async(&self) -> bool {
            self.$inner.writes_async()
        }
    };
    (@ $inner:ident flush_async) => {
        fn flush_async(&self, done: $crate::FlushDone) {
            self.$inner.flush_async(done)
        }
    };
    (@ $inner:ident lend) => {
        fn lend(
            &self,
            offset: u64,
            len: u64,
            wait: bool,
        ) -> std::io::Result<Option<$crate::Lent>> {
            self.$inner.lend(offset, len, wait)
        }
    };
    (@ $inner:ident can_lend) => {
        fn can_lend(&self) -> bool {
            self.$inner.can_lend()
        }
    };
    (@ $inner:ident lends_memory) => {
        fn lends_memory(&self) -> bool {
            self.$inner.lends_memory()
        }
    };
    (@ $inner:ident write_at) => {
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            self.$inner.write_at(buf, offset)
        }
    };
    (@ $inner:ident discard) => {
        fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
            self.$inner.discard(offset, len)
        }
    };
    (@ $inner:ident write_zeroes) => {
        fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()> {
            self.$inner.write_zeroes(offset, len)
        }
    };
    (@ $inner:ident flush) => {
        fn flush(&self) -> std::io::Result<()> {
            self.$inner.flush()
        }
    };
    (@ $inner:ident is_allocated) => {
        fn is_allocated(&self, offset: u64, len: u64) -> std::io::Result<Vec<(u64, u64, bool)>> {
            self.$inner.is_allocated(offset, len)
        }
    };
    (@ $inner:ident supports_discard) => {
        fn supports_discard(&self) -> bool {
            self.$inner.supports_discard()
        }
    };
    (@ $inner:ident read_only) => {
        fn read_only(&self) -> bool {
            self.$inner.read_only()
        }
    };
    (@ $inner:ident description) => {
        fn description(&self) -> String {
            self.$inner.description()
        }
    };
    (@ $inner:ident sidecar) => {
        fn sidecar(&self, suffix: &str) -> Option<std::path::PathBuf> {
            self.$inner.sidecar(suffix)
        }
    };
}

/// Inside `impl Backstore for S`, for a store whose bytes are in memory: a read never
/// waits, so `try_read_at` always reads (`read_at`), and the store lends (`lend`) windows
/// on memory of its own, which anyone may read.
macro_rules! in_memory {
    () => {
        fn try_read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<bool> {
            self.read_at(buf, offset).map(|()| true)
        }

        fn can_lend(&self) -> bool {
            true
        }

        fn lends_memory(&self) -> bool {
            true
        }
    };
}
