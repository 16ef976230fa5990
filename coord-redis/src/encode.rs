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
        let value = owner.as_u128();
        let mut out = [0u8; 32];
        for (i, digit) in out.iter_mut().enumerate() {
            let shift = (31 - i) * 4;
            *digit = HEX[((value >> shift) & 0xf) as usize];
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
        loop {
            start -= 1;
            digits[start] = b'0' + (value % 10) as u8;
            value /= 10;
            if value == 0 {
                break;
            }
        }
        Decimal { digits, start }
    }
}

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
