//! Serial number arithmetic (RFC 1982, SERIAL_BITS = 32) for CmdSN, StatSN, DataSN and
//! R2TSN, which wrap around.
//!
//! Two numbers exactly 2^31 apart are incomparable under RFC 1982: every ordering
//! predicate below returns false for such a pair (except equality-based `le`/`ge`, which
//! only hold for equal numbers).

/// `a < b` in serial arithmetic.
pub fn sn_lt(a: u32, b: u32) -> bool {
    // The difference, read as signed, is positive exactly when b is "ahead" of a by less
    // than half the number space; at exactly 2^31 it is i32::MIN and the pair is undefined.
    (b.wrapping_sub(a) as i32) > 0
}

/// `a > b` in serial arithmetic.
pub fn sn_gt(a: u32, b: u32) -> bool {
    sn_lt(b, a)
}

/// `a <= b` in serial arithmetic.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// `a >= b` in serial arithmetic.
pub fn sn_ge(a: u32, b: u32) -> bool {
    a == b || sn_gt(a, b)
}

/// Whether `exp <= sn <= max` in serial arithmetic: the CmdSN window test. A window with
/// `max == exp - 1` is empty (RFC 7143 section 4.2.2.1), and this returns false for it.
pub fn sn_in_window(sn: u32, exp: u32, max: u32) -> bool {
    sn_le(exp, sn) && sn_le(sn, max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps() {
        assert!(sn_lt(u32::MAX, 0));
        assert!(sn_gt(0, u32::MAX));
        assert!(sn_lt(0xffff_fff0, 5));
        assert!(!sn_lt(5, 0xffff_fff0));
        assert!(sn_in_window(1, u32::MAX - 1, 3));
        assert!(!sn_in_window(4, u32::MAX - 1, 3));
        assert!(!sn_in_window(10, 10, 9));
    }

    #[test]
    fn half_space_apart_is_undefined() {
        assert!(!sn_lt(0, 0x8000_0000));
        assert!(!sn_gt(0, 0x8000_0000));
        assert!(!sn_le(0, 0x8000_0000));
        assert!(!sn_ge(0, 0x8000_0000));
    }

    proptest! {
        #[test]
        fn irreflexive_and_asymmetric(a: u32, b: u32) {
            prop_assert!(!sn_lt(a, a));
            prop_assert!(!(sn_lt(a, b) && sn_lt(b, a)));
            prop_assert_eq!(sn_gt(a, b), sn_lt(b, a));
        }

        #[test]
        fn trichotomy_unless_half_apart(a: u32, b: u32) {
            let defined = b.wrapping_sub(a) != 0x8000_0000;
            let count = [a == b, sn_lt(a, b), sn_gt(a, b)].iter().filter(|x| **x).count();
            prop_assert_eq!(count, usize::from(defined));
        }

        #[test]
        fn successor_is_greater(a: u32, n in 1u32..0x8000_0000) {
            prop_assert!(sn_lt(a, a.wrapping_add(n)));
            prop_assert!(sn_gt(a.wrapping_add(n), a));
            prop_assert!(sn_le(a, a.wrapping_add(n)));
            prop_assert!(!sn_ge(a, a.wrapping_add(n)));
        }

        #[test]
        fn translation_invariant(a: u32, b: u32, k: u32) {
            prop_assert_eq!(sn_lt(a, b), sn_lt(a.wrapping_add(k), b.wrapping_add(k)));
        }

        #[test]
        fn window_contains_exactly_its_range(exp: u32, width in 0u32..0x8000_0000, off: u32) {
            let max = exp.wrapping_add(width);
            let sn = exp.wrapping_add(off);
            prop_assert_eq!(sn_in_window(sn, exp, max), off <= width);
        }
    }
}
