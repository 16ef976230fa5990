//! Errors collected so that every mistake in the attributes is reported together, not only
//! the first one found.

/// Collects errors so that all of them are reported together.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(err),
            None => self.0 = Some(err),
        }
    }

    pub(crate) fn append(&mut self, other: Errors) {
        if let Some(err) = other.0 {
            self.push(err);
        }
    }

    pub(crate) fn into_error(self) -> Option<syn::Error> {
        self.0
    }

    /// How many errors were pushed so far.
    pub(crate) fn count(&self) -> usize {
        self.0.as_ref().map_or(0, |all| all.into_iter().count())
    }

    /// All the errors, with `last` after them.
    pub(crate) fn then(self, last: syn::Error) -> syn::Error {
        match self.0 {
            Some(mut all) => {
                all.combine(last);
                all
            }
            None => last,
        }
    }
}
