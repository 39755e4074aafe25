//! WRITE COMPRESSED (16)'s Data-Out: one zstd frame that must decompress to exactly the
//! blocks the CDB names. Sans-IO and fuzzed (`fuzz/fuzz_targets/write_compressed.rs`):
//! the output is bounded by the CDB's length (itself bounded by the logical unit's
//! MAXIMUM TRANSFER LENGTH) before a byte is decompressed, so a small frame cannot make
//! the target allocate more than a plain WRITE of the same blocks would carry.

/// The bytes `frame` holds, when they are exactly `len` bytes; `None` for a frame that is
/// malformed, longer than `len` itself, or decompresses to any other length.
pub fn decompress(frame: &[u8], len: usize) -> Option<Vec<u8>> {
    // Compression that does not pay is sent plainly: a frame as long as its data is wrong.
    if frame.len() > len {
        return None;
    }
    let mut out = Vec::with_capacity(len);
    // A context kept per thread: a new one per command allocated (and for the first
    // frames of each, sized) its tables again, once a unit on a stream that compresses.
    // A context is reset by the next frame's header: one that failed leaves nothing behind.
    thread_local! {
        static CONTEXT: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let done = CONTEXT.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = Some(zstd::bulk::Decompressor::new().ok()?);
        }
        let d = c.as_mut()?;
        // Writes at most the capacity (an error past it), never reallocating.
        d.decompress_to_buffer(frame, &mut out).ok()
    });
    done?;
    (out.len() == len).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_lengths_only() {
        let data: Vec<u8> = (0..65536u32).map(|i| (i % 7) as u8).collect();
        let frame = zstd::bulk::compress(&data, 1).unwrap();
        assert!(frame.len() < data.len() / 10);
        assert_eq!(decompress(&frame, data.len()).as_deref(), Some(&data[..]));
        // Shorter or longer than the CDB says: refused.
        assert_eq!(decompress(&frame, data.len() - 512), None);
        assert_eq!(decompress(&frame, data.len() + 512), None);
        // Not a frame, a truncated frame, nothing.
        assert_eq!(decompress(&data[..4096], 65536), None);
        assert_eq!(decompress(&frame[..frame.len() - 1], data.len()), None);
        assert_eq!(decompress(&[], 512), None);
        // A frame longer than its data.
        assert_eq!(decompress(&frame, 16), None);
    }
}
