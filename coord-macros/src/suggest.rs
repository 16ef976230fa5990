//! Suggestions in error messages: the likely intended name or word, and lists of names.

/// The closest name in `candidates`, if one is close enough to be a likely typo.
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// Renders names as a list: `a`, `b`, `c`.
pub(crate) fn list(names: impl IntoIterator<Item = impl std::fmt::Display>) -> String {
    names
        .into_iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The one word of `words` that has an `_`-separated part (of four letters or more, so short
/// parts do not match by accident) found in no other word and contained in `written`.
pub(crate) fn by_distinctive_part(written: &str, words: &[&'static str]) -> Option<&'static str> {
    let written = written.to_ascii_lowercase();
    let distinctive = |word: &str| {
        word.split('_')
            .filter(|part| part.len() >= 4)
            .filter(|part| {
                words
                    .iter()
                    .filter(|other| other.split('_').any(|p| p == *part))
                    .count()
                    == 1
            })
            .any(|part| written.contains(part))
    };
    let mut matching = words.iter().copied().filter(|word| distinctive(word));
    match (matching.next(), matching.next()) {
        (Some(word), None) => Some(word),
        _ => None,
    }
}
