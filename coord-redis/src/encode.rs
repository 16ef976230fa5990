//! Command arguments encoded on the stack: owner tokens as hex, numbers as decimal text.
//!
//! Every lock operation sends a token and a lease; formatting them into fresh `String`s cost
//! an allocation each on the hottest path. These fixed-size buffers live in the caller's frame
//! for as long as the command that borrows them.

use coord_core::provider::OwnerToken;

/// An owner token as Redis stores it: 32 lowercase hex digits.
#[derive(Clone, Copy)]
pub(crate) struct TokenText([u8; 32]);

impl TokenText {
    pub(crate) fn new(owner: OwnerToken) -> TokenText {
        let value = owner.as_u128();
        let mut out = [0u8; 32];
        for (chunk, i) in out.chunks_exact_mut(8).zip(0..) {
            let word = (value >> (96 - 32 * i)) as u32;
            chunk.copy_from_slice(&hex8(word).to_be_bytes());
        }
        TokenText(out)
    }
}

/// The 8 hex digits of `x` as the bytes of a `u64`, most significant digit in the most
/// significant byte: 8 digits in a few arithmetic steps instead of a table look-up each.
fn hex8(x: u32) -> u64 {
    let mut x = u64::from(x);
    // Spread the nibbles one per byte, keeping their order.
    x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    // `0`..`9` for 0..9; `a`..`f` (39 further on) for 10..15. No byte carries into the next.
    let over_nine = ((x + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    x + 0x3030_3030_3030_3030 + over_nine * 39
}

impl AsRef<[u8]> for TokenText {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A non-negative integer in decimal.
#[derive(Clone, Copy)]
pub(crate) struct Decimal {
    digits: [u8; 20],
    start: usize,
}

impl Decimal {
    pub(crate) fn new(mut value: u64) -> Decimal {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        // Two digits per division.
        while value >= 100 {
            let pair = (value % 100) as usize * 2;
            value /= 100;
            start -= 2;
            digits[start..start + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        }
        if value >= 10 {
            let pair = value as usize * 2;
            start -= 2;
            digits[start..start + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        } else {
            start -= 1;
            digits[start] = b'0' + value as u8;
        }
        Decimal { digits, start }
    }
}

/// `00`, `01`, ... `99`, back to back.
const PAIRS: [u8; 200] = {
    let mut out = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        out[2 * i] = b'0' + (i / 10) as u8;
        out[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    out
};

impl AsRef<[u8]> for Decimal {
    fn as_ref(&self) -> &[u8] {
        &self.digits[self.start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn edges() {
        assert_eq!(Decimal::new(0).as_ref(), b"0");
        assert_eq!(
            Decimal::new(u64::MAX).as_ref(),
            u64::MAX.to_string().as_bytes()
        );
        for value in [1, 9, 10, 11, 99, 100, 101, 999, 1000, 30_000, 3_600_000] {
            assert_eq!(Decimal::new(value).as_ref(), value.to_string().as_bytes());
        }
        let token = OwnerToken::from_u128(0x0123_4567_89ab_cdef_0000_0000_0000_00ff);
        assert_eq!(
            TokenText::new(token).as_ref(),
            b"0123456789abcdef00000000000000ff"
        );
        assert_eq!(
            TokenText::new(OwnerToken::from_u128(u128::MAX)).as_ref(),
            b"ffffffffffffffffffffffffffffffff"
        );
        assert_eq!(
            TokenText::new(OwnerToken::from_u128(
                0xfedc_ba98_7654_3210_a9a9_0909_1010_f0f0
            ))
            .as_ref(),
            b"fedcba9876543210a9a909091010f0f0"
        );
    }

    proptest! {
        #[test]
        fn decimal_matches_display(value: u64) {
            let (ours, std) = (Decimal::new(value), value.to_string());
            prop_assert_eq!(ours.as_ref(), std.as_bytes());
        }

        #[test]
        fn token_matches_display(value: u128) {
            let token = OwnerToken::from_u128(value);
            let ours = TokenText::new(token);
            let (hex, shown) = (format!("{value:032x}"), token.to_string());
            prop_assert_eq!(ours.as_ref(), hex.as_bytes());
            prop_assert_eq!(ours.as_ref(), shown.as_bytes());
        }
    }
}
