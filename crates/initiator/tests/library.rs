//! The initiator library's `Lun` and copy engine against Reservoir's target started in
//! this process with a RAM LUN: byte offsets that start and end inside blocks, requests
//! split at the target's maximum transfer length, UNMAP, zeroes and LBA status, and a
//! copy resumed from an offset with its progress. (The target is a dev-dependency only:
//! the initiator's own dependencies stay free of it and of clap.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use initiator::copy::{self, CopyOptions, Endpoint, Phase};
use initiator::{Error, Lun, Provisioning, SessionOptions};
use testkit::{inproc, random_bytes};

const IQN: &str = "iqn.2026-11.org.reservoir:library";
const MIB: u64 = 1 << 20;

/// A LUN of a target started for it; the target runs as long as the handle lives.
async fn open(size: u64) -> (Lun, targetd::Running) {
    let target = inproc::spawn(&inproc::one_lun("", IQN, &inproc::ram(&size.to_string()))).await;
    let lun = Lun::open_url(&inproc::url(&target, IQN, 0), &SessionOptions::default())
        .await
        .unwrap();
    (lun, target)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaligned_and_split_reads_and_writes_match_a_model() {
    let size = 32 * MIB;
    let (lun, _target) = open(size).await;
    assert_eq!((lun.size(), lun.block_size()), (size, 512));
    let max = lun.max_transfer_bytes();
    assert!(
        max > 0 && max < 9 * MIB,
        "the big write below must split: {max}"
    );
    let mut model = vec![0u8; size as usize];
    let writes: [(u64, usize); 7] = [
        (0, 512),                              // one whole block
        (100, 10),                             // inside a block
        (500, 24),                             // across one boundary
        (1000, 5000),                          // partial head, whole blocks, partial tail
        (3 * MIB + 7, (9 * MIB + 3) as usize), // all that, split at the maximum transfer
        (size - 300, 300),                     // the very end
        (16 * MIB, (8 * MIB) as usize),        // aligned, exactly the maximum or more
    ];
    for (i, &(off, len)) in writes.iter().enumerate() {
        let data = random_bytes(len, i as u64);
        lun.write_at(off, Bytes::from(data.clone())).await.unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&data);
        let back = lun.read_at(off, len).await.unwrap();
        assert!(back[..] == data[..], "write {i} at {off}+{len}");
    }
    // Reads of their own: unaligned, split, into a buffer.
    for (off, len) in [
        (1, 1),
        (511, 2),
        (3 * MIB + 1, (10 * MIB) as usize),
        (0, size as usize),
    ] {
        let r = lun.read_at(off, len).await.unwrap();
        assert!(
            r[..] == model[off as usize..off as usize + len],
            "{off}+{len}"
        );
        let mut buf = vec![0u8; len];
        lun.read_into(off, &mut buf).await.unwrap();
        assert!(
            buf == model[off as usize..off as usize + len],
            "into {off}+{len}"
        );
    }
    // Disjoint bytes of one block written at once: each read-modify-write keeps the others.
    let writers: Vec<_> = (0..8u64)
        .map(|i| {
            let lun = lun.clone();
            tokio::spawn(async move {
                lun.write_slice_at(20 * 512 + i * 64, &[i as u8 + 1; 64])
                    .await
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap().unwrap();
    }
    let block = lun.read_at(20 * 512, 512).await.unwrap();
    for i in 0..8 {
        assert!(block[i * 64..(i + 1) * 64]
            .iter()
            .all(|&b| b == i as u8 + 1));
    }
    lun.write_fua(7 * 512 + 3, Bytes::from_static(b"forced"))
        .await
        .unwrap();
    lun.flush().await.unwrap();
    assert_eq!(&lun.read_at(7 * 512 + 3, 6).await.unwrap()[..], b"forced");
    let _ = lun.session().logout().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_end_is_refused() {
    let (lun, _target) = open(MIB).await;
    assert!(matches!(
        lun.read_at(MIB - 10, 11).await,
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        lun.write_at(MIB, Bytes::from_static(b"x")).await,
        Err(Error::OutOfRange { .. })
    ));
    assert!(lun.read_at(MIB, 0).await.unwrap().is_empty());
    let _ = lun.session().logout().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmap_zeroes_and_lba_status() {
    let (lun, _target) = open(16 * MIB).await;
    lun.write_at(4 * MIB, Bytes::from(vec![0xaa; 2 * MIB as usize]))
        .await
        .unwrap();
    let st = lun.get_lba_status(3 * MIB, 4 * MIB).await.unwrap();
    let at = |off: u64| {
        st.iter()
            .find(|e| e.offset <= off && off < e.offset + e.len)
            .map(|e| e.status)
    };
    assert_eq!(st.first().unwrap().offset, 3 * MIB);
    let last = st.last().unwrap();
    assert_eq!(last.offset + last.len, 7 * MIB, "{st:?}");
    assert_eq!(at(3 * MIB), Some(Provisioning::Deallocated), "{st:?}");
    assert_eq!(at(5 * MIB), Some(Provisioning::Mapped), "{st:?}");
    // Whole blocks inside the range go; the partial ones at its edges stay.
    lun.unmap(4 * MIB - 100, MIB + 100).await.unwrap();
    let st = lun.get_lba_status(4 * MIB, MIB).await.unwrap();
    assert!(
        st.iter().all(|e| e.status == Provisioning::Deallocated),
        "{st:?}"
    );
    assert!(lun
        .read_at(4 * MIB, MIB as usize)
        .await
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    // Zeroes from inside one block to inside another, around whole blocks.
    lun.write_zeroes(5 * MIB + 100, 5000).await.unwrap();
    let r = lun.read_at(5 * MIB, 6000).await.unwrap();
    assert!(r[..100].iter().all(|&b| b == 0xaa));
    assert!(r[100..5100].iter().all(|&b| b == 0));
    assert!(r[5100..].iter().all(|&b| b == 0xaa));
    let _ = lun.session().logout().await;
}

/// A copy resumed from an offset leaves what is below it alone, copies the rest and
/// reports it through the callback as it goes; then the LUN is copied back to a fresh
/// file, skipping zero chunks, and verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_resumes_from_an_offset_with_progress() {
    let (lun, _target) = open(16 * MIB).await;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("image");
    // Not a whole number of blocks: the last one is zero-filled on the LUN.
    let size = 6 * MIB + 1000;
    let mut data = random_bytes(size as usize, 7);
    data[(3 * MIB) as usize..(4 * MIB) as usize].fill(0);
    std::fs::write(&img, &data).unwrap();
    let resume = 2 * MIB;
    lun.write_at(0, Bytes::from(vec![0xab; resume as usize]))
        .await
        .unwrap();
    lun.write_at(size, Bytes::from(vec![0xcd; 1000]))
        .await
        .unwrap();

    let src = Endpoint::open_file(&img).unwrap();
    let dst = Endpoint::Lun(lun.clone());
    let opts = CopyOptions {
        chunk_size: 256 * 1024,
        queue_depth: Some(4),
        start_offset: resume,
        ..CopyOptions::default()
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let r = copy::copy(&src, &dst, &opts, move |p| s.lock().unwrap().push(p))
        .await
        .unwrap();
    assert!(r.complete);
    assert_eq!((r.bytes, r.total_bytes), (size - resume, size));
    assert_eq!(r.copied_prefix_bytes, size);
    assert_eq!((r.chunk_size, r.queue_depth), (256 * 1024, 4));
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(seen.len() as u64, (size - resume).div_ceil(256 * 1024));
    assert!(seen.windows(2).all(|w| w[0].bytes < w[1].bytes));
    let last = seen.last().unwrap();
    assert_eq!(
        (last.phase, last.bytes, last.total_bytes),
        (Phase::Copy, size - resume, size - resume)
    );
    assert_eq!(last.eta, Some(Duration::ZERO));

    let on_lun = lun.read_at(0, (size + 1000) as usize).await.unwrap();
    assert!(on_lun[..resume as usize].iter().all(|&b| b == 0xab));
    assert!(on_lun[resume as usize..size as usize] == data[resume as usize..]);
    // The rest of the image's last block is zero-filled; what follows it is untouched.
    let end = size.div_ceil(512) as usize * 512;
    assert!(on_lun[size as usize..end].iter().all(|&b| b == 0));
    assert!(on_lun[end..].iter().all(|&b| b == 0xcd));

    // Back to a fresh file, skipping zero chunks (the image's zero megabyte and the
    // LUN's never written end), verified.
    let whole = dir.path().join("whole");
    let (out, fresh) = Endpoint::create_file(&whole, 16 * MIB, true).unwrap();
    assert!(fresh);
    let opts = CopyOptions {
        skip_zeros: true,
        verify: true,
        ..CopyOptions::default()
    };
    let verified = Arc::new(Mutex::new(0u64));
    let v = verified.clone();
    let r = copy::copy(&dst, &out, &opts, move |p| {
        if p.phase == Phase::Verify {
            *v.lock().unwrap() = p.bytes;
        }
    })
    .await
    .unwrap();
    assert!(r.complete && r.checksum.is_some(), "{r:?}");
    assert_eq!(r.skipped_zero_bytes, 10 * MIB);
    assert_eq!(*verified.lock().unwrap(), 16 * MIB);
    let back = std::fs::read(&whole).unwrap();
    assert!(back[..on_lun.len()] == on_lun[..] && back[on_lun.len()..].iter().all(|&b| b == 0));
    // The image and the copy differ in the resumed-over prefix: verify says where.
    let img = Endpoint::open_file(&img).unwrap();
    let e = copy::verify(&img, &out, MIB, 4, |_| {}).await.unwrap_err();
    assert!(
        matches!(
            e,
            copy::CopyError::Mismatch {
                chunks: 2,
                first_offset: 0
            }
        ),
        "{e}"
    );
    let _ = lun.session().logout().await;
}
