//! `key_from_each` of `#[distributed_lock]`: a multi-key lock, one key per element of a
//! collection parameter. Checked here into the lock layer's `each` path; whether the named
//! parameter is a collection is checked by the compiler, through the
//! `coord_core::__private::EachKeyPart` bound the generated code puts on it.

use crate::args::Args;
use crate::errors::Errors;
use crate::options::{FENCED, KEY_FROM, KEY_FROM_EACH, PERMITS};
use crate::value::KeyPath;

/// The collection parameter of `key_from_each`, if written, checked against the lock's other
/// options (the caller checks that it names a parameter); every problem is pushed onto
/// `errors`, spanned at what the user wrote.
pub(crate) fn each_path(layer: &Args, errors: &mut Errors) -> Option<KeyPath> {
    let setting = layer.written(&KEY_FROM_EACH)?;
    let paths = layer.paths(&KEY_FROM_EACH).unwrap_or_default();
    let [path] = paths else {
        errors.push(setting.error(
            "`key_from_each` names one collection parameter, whose elements are the keys to \
             lock (one lock per element): `key_from_each = \"accounts\"`",
        ));
        return None;
    };
    if let Some(key_from) = layer.written(&KEY_FROM) {
        errors.push(key_from.error(
            "`key_from` and `key_from_each` both name this lock's keys: give `key_from_each` \
             alone for one lock per element, or `key_from` alone for one lock",
        ));
    }
    if let Some(permits) = layer.written(&PERMITS) {
        errors.push(permits.error(
            "`permits` and `key_from_each` do not combine: a semaphore is one key with several \
             holders, a multi-key lock several keys with one holder",
        ));
    }
    if layer.flag(&FENCED) == Some(false) {
        if let Some(fenced) = layer.written(&FENCED) {
            errors.push(fenced.error(
                "every key of a multi-key lock carries its own fencing token: remove \
                 `fenced = false` (with `key_from_each`, `fencing_token_of(&key)` reads each one)",
            ));
        }
    }
    Some(path.clone())
}
