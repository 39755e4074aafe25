//! Recycled buffers for command data.
//!
//! A 1 MiB read used to get a fresh zeroed `Vec` each time; the allocator handed back pages
//! the kernel had to fault in and clear, and zeroed them again, which cost the target more
//! CPU than the read and the send together (a third of it on 1 MiB sequential reads). Data
//! buffers of 4 KiB and more now come from a bounded pool of power-of-two size classes and
//! go back to it when dropped.
//!
//! A buffer taken from the pool holds whatever its last user left in it: every user
//! overwrites all of it (a read fills the whole buffer or fails; a write's data sequences
//! cover the whole transfer before the command runs) or drops it unread.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Smallest pooled class (4 KiB) as a power of two; smaller buffers are cheap to allocate.
const MIN_SHIFT: u32 = 12;
/// Largest pooled class (16 MiB).
const MAX_SHIFT: u32 = 24;
const CLASSES: usize = (MAX_SHIFT - MIN_SHIFT + 1) as usize;
/// Bytes the pool may hold idle, all classes together.
const LIMIT_BYTES: usize = 128 << 20;

struct Pool {
    classes: [Mutex<Vec<Vec<u8>>>; CLASSES],
    idle_bytes: AtomicUsize,
}

static POOL: Pool = Pool {
    classes: [const { Mutex::new(Vec::new()) }; CLASSES],
    idle_bytes: AtomicUsize::new(0),
};

/// The size class whose buffers hold `len` bytes, if `len` is pooled at all.
fn class_of(len: usize) -> Option<usize> {
    if !(1 << MIN_SHIFT..=1 << MAX_SHIFT).contains(&len) {
        return None;
    }
    let shift = usize::BITS - (len - 1).leading_zeros();
    Some((shift - MIN_SHIFT) as usize)
}

/// A byte buffer of a fixed length that returns to the pool when dropped.
#[derive(Default)]
pub struct Buf(Vec<u8>);

impl Buf {
    /// A buffer of exactly `len` bytes with unspecified contents.
    pub fn take(len: usize) -> Self {
        let Some(class) = class_of(len) else {
            return Buf(vec![0; len]);
        };
        let reused = POOL.classes[class]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        let mut v = match reused {
            Some(v) => {
                POOL.idle_bytes.fetch_sub(v.capacity(), Ordering::Relaxed);
                v
            }
            // Fresh zeroed pages straight from the system: no memset.
            None => vec![0; 1 << (class as u32 + MIN_SHIFT)],
        };
        v.truncate(len);
        Buf(v)
    }

    /// Wraps a vector so that it goes to the pool when dropped.
    pub fn from_vec(v: Vec<u8>) -> Self {
        Buf(v)
    }

    /// The vector, no longer bound for the pool.
    pub fn into_vec(mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.0);
        let cap = v.capacity();
        // Only whole classes are kept, so that `take` can count on the capacity.
        if !cap.is_power_of_two() || class_of(cap).is_none() {
            return;
        }
        if POOL.idle_bytes.fetch_add(cap, Ordering::Relaxed) + cap > LIMIT_BYTES {
            POOL.idle_bytes.fetch_sub(cap, Ordering::Relaxed);
            return;
        }
        // The bytes beyond `len` were initialised when the vector was made; restoring the
        // length writes only the part the last user cut off.
        v.resize(cap, 0);
        let class = class_of(cap).expect("checked above");
        POOL.classes[class]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(v);
    }
}

impl Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buf({} bytes)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_powers_of_two_from_4k_to_16m() {
        assert_eq!(class_of(4095), None);
        assert_eq!(class_of(4096), Some(0));
        assert_eq!(class_of(4097), Some(1));
        assert_eq!(class_of(1 << 20), Some(8));
        assert_eq!(class_of((1 << 20) + 1), Some(9));
        assert_eq!(class_of(16 << 20), Some(CLASSES - 1));
        assert_eq!(class_of((16 << 20) + 1), None);
    }

    #[test]
    fn a_buffer_has_the_length_asked_for_and_comes_back_whole() {
        for len in [0usize, 100, 4096, 5000, 65536, 1 << 20, 3 << 20] {
            let mut b = Buf::take(len);
            assert_eq!(b.len(), len);
            b.fill(0xa5);
            drop(b);
            let again = Buf::take(len);
            assert_eq!(again.len(), len);
        }
        // A shorter buffer of a class a longer one used keeps only its own length.
        let mut long = Buf::take(8192);
        long.fill(1);
        drop(long);
        let short = Buf::take(4097);
        assert_eq!(short.len(), 4097);
    }

    #[test]
    fn into_vec_keeps_the_data_out_of_the_pool() {
        let mut b = Buf::take(4096);
        b.fill(7);
        let v = b.into_vec();
        assert_eq!(v.len(), 4096);
        assert!(v.iter().all(|&x| x == 7));
    }

    #[test]
    fn odd_capacities_are_not_pooled() {
        // Dropping a vector of a capacity no class has must not poison a class.
        drop(Buf::from_vec(Vec::with_capacity(5000)));
        drop(Buf::from_vec(vec![0; 3 << 20]));
        let b = Buf::take(5000);
        assert!(b.0.capacity() >= 5000);
        assert!(b.0.capacity().is_power_of_two());
    }
}
