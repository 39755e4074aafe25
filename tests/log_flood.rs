//! A flood of peers that break the protocol cannot flood the target's log: lines caused
//! by peers are capped at 20 a second, and the next line let through says how many were
//! left out, so that none goes uncounted.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

#[test]
fn a_flood_of_bad_connections_is_logged_at_a_capped_rate_and_counted() {
    let target = testkit::Target::start(None);
    let bad = |n: usize| {
        for _ in 0..n {
            // A SCSI Command before login: the target closes the connection, with a line.
            let mut s = TcpStream::connect(&target.portal).unwrap();
            let mut bhs = [0u8; 48];
            bhs[0] = 0x01;
            let _ = s.write_all(&bhs);
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.read(&mut [0u8; 64]);
        }
    };
    bad(300);
    // A second later, one more: its line carries the count of those left out.
    std::thread::sleep(Duration::from_millis(1100));
    bad(1);
    std::thread::sleep(Duration::from_millis(300));
    let log = target.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("connection closed"))
        .collect();
    let left_out: u64 = lines
        .iter()
        .filter_map(|l| {
            let (_, tail) = l.rsplit_once(" (")?;
            tail.strip_suffix(" similar lines left out before this one)")?
                .parse::<u64>()
                .ok()
        })
        .sum();
    println!(
        "301 bad connections: {} lines logged, {left_out} counted as left out",
        lines.len()
    );
    assert!(lines.len() <= 3 * 20 + 1, "{} lines:\n{log}", lines.len());
    assert!(left_out > 0, "no line says what was left out:\n{log}");
    assert_eq!(
        lines.len() as u64 + left_out,
        301,
        "every line logged or counted:\n{log}"
    );
}
