//! Reading the mission file's JSON object: its string fields, and the string maps of `env` and
//! `labels`, each refusal naming the field.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{MissionError, refuse};

fn string_of<'a>(field: &str, value: &'a Value) -> Result<&'a str, MissionError> {
    let text = value
        .as_str()
        .ok_or_else(|| refuse(field, "must be a string"))?;
    if text.contains('\0') {
        return Err(refuse(field, "must not contain NUL characters"));
    }
    Ok(text)
}

pub(super) fn required_string<'a>(
    object: &'a Map<String, Value>,
    field: &str,
) -> Result<&'a str, MissionError> {
    match object.get(field) {
        None | Some(Value::Null) => Err(refuse(field, "is required")),
        Some(value) => string_of(field, value),
    }
}

pub(super) fn optional_string<'a>(
    object: &'a Map<String, Value>,
    field: &str,
) -> Result<Option<&'a str>, MissionError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => string_of(field, value).map(Some),
    }
}

pub(super) fn string_map(
    object: &Map<String, Value>,
    field: &str,
    max: usize,
) -> Result<BTreeMap<String, String>, MissionError> {
    let entries = match object.get(field) {
        None | Some(Value::Null) => return Ok(BTreeMap::new()),
        Some(Value::Object(entries)) => entries,
        Some(_) => {
            return Err(refuse(field, "must be an object of strings"));
        }
    };
    if entries.len() > max {
        return Err(refuse(
            field,
            format!("has {} entries; at most {max} are allowed", entries.len()),
        ));
    }
    entries
        .iter()
        .map(|(key, value)| {
            let path = format!("{field}.{key}");
            if key.contains('\0') {
                return Err(refuse(field, "names must not contain NUL characters"));
            }
            Ok((key.clone(), string_of(&path, value)?.to_owned()))
        })
        .collect()
}
