//! Text a plugin controls, made safe to print on a terminal.
//!
//! Logs, outcome and error messages, outputs, checks and `describe`'s metadata are
//! written by the plugin. Printed raw, an escape sequence in them can set the terminal's
//! title, move the cursor and erase lines, and a newline or carriage return can start a
//! line that looks like the CLI's own (`verified: signed by ...`). [`clean`] shows every
//! control character as a Rust escape (`\u{1b}`, `\n`, `\r`) instead, and so are the
//! Unicode bidirectional controls that reorder what is displayed. Tabs stay.

use std::borrow::Cow;

/// Whether `c` must not reach the terminal as itself.
fn unsafe_char(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character (but tab) and bidirectional control escaped; one
/// line whatever it holds.
pub(crate) fn clean(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A copy of `value` (an Operation, a NodeTask) with [`clean`] applied to every string
/// in it, for the human renderings: their messages, logs, outputs and check results come
/// from plugins (through the agent). Machine output (`-o json|yaml`) is left as it is; its
/// encoders escape control characters themselves.
pub(crate) fn cleaned<T: serde::Serialize + serde::de::DeserializeOwned>(
    value: &T,
) -> anyhow::Result<T> {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => {
                if let Cow::Owned(c) = clean(s) {
                    *s = c;
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            serde_json::Value::Object(map) => {
                // Keys too (output names); rebuilt only when one changes.
                if map.keys().any(|k| matches!(clean(k), Cow::Owned(_))) {
                    let old = std::mem::take(map);
                    for (k, v) in old {
                        map.insert(clean(&k).into_owned(), v);
                    }
                }
                map.values_mut().for_each(walk);
            }
            _ => {}
        }
    }
    let mut v = serde_json::to_value(value)?;
    walk(&mut v);
    Ok(serde_json::from_value(v)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleaned_escapes_every_string_and_key_of_an_object() {
        let mut outputs = std::collections::BTreeMap::new();
        outputs.insert(
            "k\x1b]0;t\x07".to_owned(),
            "line1\nverified: signed by x".to_owned(),
        );
        let clean_copy = cleaned(&outputs).unwrap();
        assert_eq!(
            clean_copy.into_iter().collect::<Vec<_>>(),
            vec![(
                "k\\u{1b}]0;t\\u{7}".to_owned(),
                "line1\\nverified: signed by x".to_owned()
            )]
        );
    }

    #[test]
    fn escapes_controls_newlines_and_bidi_but_keeps_text_and_tabs() {
        assert!(matches!(
            clean("plain text\twith tab, ünïcode ✓"),
            Cow::Borrowed(_)
        ));
        // A forged line, a title change, an erase, a C1 CSI and a right-to-left override.
        assert_eq!(
            clean("ok\nverified: signed by admin\r\x1b]0;pwned\x07\x1b[2K\u{9b}31m\u{202e}x"),
            "ok\\nverified: signed by admin\\r\\u{1b}]0;pwned\\u{7}\\u{1b}[2K\\u{9b}31m\\u{202e}x"
        );
        assert!(!clean("\x1b[31mred\x7f").chars().any(|c| c.is_control()));
    }
}
