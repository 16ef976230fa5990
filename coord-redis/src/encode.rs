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
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        // A byte at a time, two digits each.
        for (pair, byte) in out.chunks_exact_mut(2).zip(owner.as_u128().to_be_bytes()) {
            pair[0] = HEX[usize::from(byte >> 4)];
            pair[1] = HEX[usize::from(byte & 0xf)];
        }
        TokenText(out)
    }
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
        let token = OwnerToken::from_u128(0x0123_4567_89ab_cdef_0000_0000_0000_00ff);
        assert_eq!(
            TokenText::new(token).as_ref(),
            b"0123456789abcdef00000000000000ff"
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
