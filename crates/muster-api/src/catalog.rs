//! The catalog of every label, annotation, scheduling gate and finalizer muster writes or
//! reads, every event reason it publishes and every status condition it sets, from which the
//! book's reference pages are generated ([`pages`]).
//!
//! The entries are plain data ([`keys::KEYS`], [`events::EVENTS`], [`conditions::CONDITIONS`]).
//! The unit tests of this module read the workspace's sources and fail when code uses a
//! `*.muster.dev/*` key, an event reason or a condition type or reason the catalog lacks, or
//! when an entry names something no source uses any more.

pub mod conditions;
pub mod events;
pub mod keys;
mod render;
#[cfg(test)]
mod scan;
#[cfg(test)]
mod tests;

pub use conditions::{CONDITIONS, ConditionEntry, ReasonEntry, Status};
pub use events::{EVENTS, EventEntry, EventType};
pub use keys::{KEYS, KeyEntry, KeyKind, Origin};

/// The reference pages generated from the catalog: exactly three (file name, markdown) pairs,
/// `labels-annotations.md`, `events.md` and `conditions.md`, each a complete mdBook page.
/// Deterministic: the same catalog gives the same bytes.
///
/// Anchors: a key's row starts with `<a id="key-<slug>"></a>`, an event reason's first row
/// with `<a id="event-<slug>"></a>`, a condition type's first row with
/// `<a id="condition-<kind>-<type>"></a>` and each of its reasons' rows with
/// `<a id="condition-<kind>-<type>-<reason>"></a>`; `<slug>` is the text lowercased, every run
/// of characters other than `a-z0-9` made one `-` (see [`slug`]).
pub fn pages() -> Vec<(&'static str, String)> {
    vec![
        ("labels-annotations.md", render::keys_page(KEYS)),
        ("events.md", render::events_page(EVENTS)),
        ("conditions.md", render::conditions_page(CONDITIONS)),
    ]
}

/// The anchor form of `text`: lowercase ASCII letters and digits, every run of anything else
/// one `-`, none at either end (`scheduling.muster.dev/pod-group` ->
/// `scheduling-muster-dev-pod-group`).
pub fn slug(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}
