//! Cross-crate tests of coord, and the provider conformance suite (`conformance`).
