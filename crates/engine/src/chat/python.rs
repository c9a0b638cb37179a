//! Python's `str()` and `json.dumps()` of template values: Jinja2 under transformers prints
//! values with `str()` and its `tojson` is `json.dumps(x, ensure_ascii=False)`, which differ
//! from MiniJinja's defaults (`true` vs `True`, compact and HTML-escaped JSON).

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};

/// `str(value)`: strings verbatim, everything else as Python's `repr`-based rendering.
pub fn py_str(value: &Value) -> String {
    match value.as_str() {
        Some(s) if value.kind() == ValueKind::String => s.to_string(),
        _ => {
            let mut out = String::new();
            py_repr(value, &mut out);
            out
        }
    }
}

/// `repr(value)` as Python prints containers: `['a', 1, True, None, {'k': 1.0}]`.
fn py_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => py_number(value, out, false),
        ValueKind::String => py_str_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => {
            container(value, out, py_repr, py_repr)
        }
        _ => out.push_str(&value.to_string()),
    }
}

/// Python's string repr: single quotes unless the text has `'` and no `"`.
fn py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// An integer as is; a float as Python's `repr(float)` (`1.0`, `1e-05`, `1e+16`), or as
/// `json.dumps` writes the non-finite ones (`NaN`, `Infinity`) when `json` is set.
fn py_number(value: &Value, out: &mut String, json: bool) {
    if value.is_integer() {
        out.push_str(&value.to_string());
        return;
    }
    let x = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if x.is_nan() {
        out.push_str(if json { "NaN" } else { "nan" });
    } else if x.is_infinite() {
        let sign = if x < 0.0 { "-" } else { "" };
        out.push_str(sign);
        out.push_str(if json { "Infinity" } else { "inf" });
    } else if x == 0.0 || (1e-4..1e16).contains(&x.abs()) {
        let s = format!("{x}");
        out.push_str(&s);
        if !s.contains('.') {
            out.push_str(".0");
        }
    } else {
        // Rust's shortest round-trip digits, in Python's exponent form.
        let s = format!("{x:e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exponent.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exponent),
        };
        let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
    }
}

/// `json.dumps(value, ensure_ascii=False)`: `", "` and `": "` separators, key order kept,
/// non-ASCII written as is.
pub fn py_json(value: &Value) -> String {
    let mut out = String::new();
    json_into(value, &mut out);
    out
}

fn json_into(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => py_number(value, out, true),
        ValueKind::String => json_string(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => {
            container(value, out, json_into, |key, out| {
                json_string(&py_str(key), out)
            })
        }
        _ => json_string(&value.to_string(), out),
    }
}

/// A list as `[a, b]` or a map as `{k: v}` (key order kept), with the `", "` and `": "`
/// separators Python's `repr` and `json.dumps` share; `item` writes a value, `key` a map key.
fn container(
    value: &Value,
    out: &mut String,
    item: fn(&Value, &mut String),
    key: fn(&Value, &mut String),
) {
    let map = value.kind() == ValueKind::Map;
    out.push(if map { '{' } else { '[' });
    for (i, entry) in value.try_iter().into_iter().flatten().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        if map {
            key(&entry, out);
            out.push_str(": ");
            item(&value.get_item(&entry).unwrap_or_default(), out);
        } else {
            item(&entry, out);
        }
    }
    out.push(if map { '}' } else { ']' });
}

fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_str_of_values() {
        let v = Value::from_serialize(serde_json::json!(
            ["a", "it's", 1, 2.5, true, null, {"k": 1e-5}]
        ));
        assert_eq!(
            py_str(&v),
            r#"['a', "it's", 1, 2.5, True, None, {'k': 1e-05}]"#
        );
        assert_eq!(py_str(&Value::from(3.0)), "3.0");
        assert_eq!(py_str(&Value::from(1e16)), "1e+16");
        assert_eq!(py_str(&Value::from("x")), "x");
    }

    #[test]
    fn python_json_dumps() {
        let v = Value::from_serialize(serde_json::json!(
            {"z": "é<&>\"\n", "a": [1, 2.0, false, null], "m": {}}
        ));
        assert_eq!(
            py_json(&v),
            r#"{"z": "é<&>\"\n", "a": [1, 2.0, false, null], "m": {}}"#
        );
    }
}
