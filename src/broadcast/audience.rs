//! A broadcast's audience from a CSV file: who gets it, with which template parameters, and who
//! is left out and why, by the file's line numbers.
//!
//! The file has a header; the `phone` (or `wa_id`) column names the recipient, and each
//! parameter column fills the template's next body parameter ({{1}}, {{2}}, ...). A `tz` (or
//! `time_zone`) column may give a recipient's IANA time zone; without one it is their
//! country's, when that has a single zone ([`zones`]). Numbers
//! become E.164 digits (no `+`, spaces or punctuation); a number written the local way (a
//! leading trunk `0`) takes the default country code when one is given. A file that cannot be
//! read as such (no header, no phone column, a parameter column it lacks, broken CSV) is
//! refused whole; a bad row (an invalid number, an empty parameter, an unknown zone) or a
//! repeated number is
//! kept as skipped, with its reason and line. A parameter Meta would refuse when the template
//! goes out (a line break, a tab, more than four spaces in a row, longer than a template body
//! can be) refuses the whole file, naming its line and column, before anything is sent.
//!
//! PURE: no IO.

use std::collections::HashMap;

use crate::broadcast::zones;
use crate::store::rules::broadcast::SkipReason;
use crate::store::rules::hours::{unknown_zone, zone};

/// The columns that may name the recipient, in the order they are looked for.
const PHONE_COLUMNS: [&str; 2] = ["phone", "wa_id"];

/// The columns that may give the recipient's time zone.
const ZONE_COLUMNS: [&str; 3] = ["tz", "time_zone", "timezone"];

/// One row of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The line of the file it was on (the header is line 1).
    pub line: u64,
    /// The number as E.164 digits; as written when it could not be read.
    pub to: String,
    pub params: Vec<String>,
    /// Left out: why, in words a person reads.
    pub skipped: Option<(SkipReason, String)>,
    /// Its IANA time zone: as the file gave it, or its country's.
    pub tz: Option<String>,
}

/// Why a file is refused: nothing of it is kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the audience file has no rows")]
    Empty,
    #[error("the audience file has no phone column (a header naming phone or wa_id); it has: {0}")]
    NoPhoneColumn(String),
    #[error("the audience file has no column {name:?} for a template parameter; it has: {columns}")]
    NoSuchColumn { name: String, columns: String },
    #[error("the audience file is not CSV at line {line}: {why}")]
    Unreadable { line: u64, why: String },
    #[error("line {line}, column {column}: {why}")]
    BadParameter {
        line: u64,
        column: String,
        why: String,
    },
    #[error("recipient {place}, parameter {{{{{n}}}}}: {why}")]
    BadListedParameter { place: u64, n: usize, why: String },
}

/// The most characters of a template's body (its parameters filled in) Meta sends.
pub const MAX_PARAM_CHARS: usize = 1024;

/// Why Meta would refuse `value` as a template's text parameter (error 132018 and its kin),
/// if it would.
pub fn param_problem(value: &str) -> Option<String> {
    if value.contains(['\n', '\r']) {
        return Some("a template parameter may not hold a line break".into());
    }
    if value.contains('\t') {
        return Some("a template parameter may not hold a tab".into());
    }
    if value.contains("     ") {
        return Some("a template parameter may not hold more than 4 spaces in a row".into());
    }
    let chars = value.chars().count();
    if chars > MAX_PARAM_CHARS {
        return Some(format!(
            "{chars} characters; a template's body holds at most {MAX_PARAM_CHARS}"
        ));
    }
    None
}

/// The rows of `csv`, each parameter taken from the named `columns` in order.
///
/// # Errors
/// [`Refusal`] when the file as a whole cannot be used.
pub fn parse(csv: &str, columns: &[String], country: Option<&str>) -> Result<Vec<Row>, Refusal> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(csv.as_bytes());
    let headers = reader
        .headers()
        .map_err(|e| unreadable(&e))?
        .iter()
        .map(str::to_lowercase)
        .collect::<Vec<_>>();
    let shown = headers.join(", ");
    let phone = PHONE_COLUMNS
        .iter()
        .find_map(|name| headers.iter().position(|h| h == name))
        .ok_or_else(|| Refusal::NoPhoneColumn(shown.clone()))?;
    let zone_column = ZONE_COLUMNS
        .iter()
        .find_map(|name| headers.iter().position(|h| h == name));
    let params = columns
        .iter()
        .map(|name| {
            headers
                .iter()
                .position(|h| *h == name.to_lowercase())
                .ok_or_else(|| Refusal::NoSuchColumn {
                    name: name.clone(),
                    columns: shown.clone(),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let lines = Lines::of(csv);
    let mut rows = Vec::new();
    let mut first_line: HashMap<String, u64> = HashMap::new();
    for record in reader.records() {
        let record = record.map_err(|e| unreadable(&e))?;
        let line = record.position().map_or(0, |p| lines.at(p.byte()));
        if record.iter().all(str::is_empty) {
            continue;
        }
        let written = record.get(phone).unwrap_or_default();
        let values: Vec<String> = params
            .iter()
            .map(|&i| record.get(i).unwrap_or_default().to_owned())
            .collect();
        for (value, column) in values.iter().zip(columns) {
            if let Some(why) = param_problem(value) {
                return Err(Refusal::BadParameter {
                    line,
                    column: column.clone(),
                    why,
                });
            }
        }
        let mut row = Row {
            line,
            to: written.to_owned(),
            params: values,
            skipped: None,
            tz: None,
        };
        match e164(written, country) {
            Err(why) => row.skipped = Some((SkipReason::Invalid, why)),
            Ok(number) => {
                row.to = number.clone();
                if let Some(first) = first_line.get(&number) {
                    let why = format!("the same number as line {first}");
                    row.skipped = Some((SkipReason::Duplicate, why));
                } else {
                    first_line.insert(number, line);
                    row.skipped = empty_param(&row.params, columns);
                }
            }
        }
        let written_zone = zone_column.and_then(|i| record.get(i));
        zone_in(&mut row, written_zone);
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(Refusal::Empty);
    }
    Ok(rows)
}

/// One recipient given in a list: the number, the parameters, and the time zone if known.
pub type Listed = (String, Vec<String>, Option<String>);

/// Recipients given as a list rather than a file, read by the same rules; a row's `line` is
/// then its place in the list, from 1.
///
/// # Errors
/// [`Refusal::BadListedParameter`] for a parameter Meta would refuse.
pub fn listed(
    recipients: impl IntoIterator<Item = Listed>,
    country: Option<&str>,
) -> Result<Vec<Row>, Refusal> {
    let mut first_line: HashMap<String, u64> = HashMap::new();
    recipients
        .into_iter()
        .zip(1..)
        .map(|((written, params, tz), line)| {
            for (n, value) in params.iter().enumerate() {
                if let Some(why) = param_problem(value) {
                    return Err(Refusal::BadListedParameter {
                        place: line,
                        n: n + 1,
                        why,
                    });
                }
            }
            let mut row = Row {
                line,
                to: written.clone(),
                params,
                skipped: None,
                tz: None,
            };
            match e164(&written, country) {
                Err(why) => row.skipped = Some((SkipReason::Invalid, why)),
                Ok(number) => match first_line.get(&number) {
                    Some(first) => {
                        row.skipped =
                            Some((SkipReason::Duplicate, format!("the same number as {first}")));
                    }
                    None => {
                        first_line.insert(number.clone(), line);
                        row.to = number;
                    }
                },
            }
            zone_in(&mut row, tz.as_deref());
            Ok(row)
        })
        .collect()
}

/// A row's zone: as written (an unknown one leaves the row out), else its country's.
fn zone_in(row: &mut Row, written: Option<&str>) {
    match written.map(str::trim).filter(|w| !w.is_empty()) {
        Some(name) if zone(name).is_some() => row.tz = Some(name.to_owned()),
        Some(name) => {
            if row.skipped.is_none() {
                row.skipped = Some((SkipReason::Invalid, unknown_zone(name)));
            }
        }
        None => row.tz = zones::of_number(&row.to).map(str::to_owned),
    }
}

/// Where each line of the file starts: a record's line, counted as a person would (the CSV
/// reader counts blank lines before a record into it).
struct Lines<'a> {
    text: &'a str,
    newlines: Vec<usize>,
}

impl Lines<'_> {
    fn of(text: &str) -> Lines<'_> {
        let newlines = text.match_indices('\n').map(|(i, _)| i).collect();
        Lines { text, newlines }
    }

    /// The line of the first character at or after `byte` that is not a line break.
    fn at(&self, byte: u64) -> u64 {
        let start = usize::try_from(byte)
            .unwrap_or(usize::MAX)
            .min(self.text.len());
        let breaks = self.text[start..]
            .bytes()
            .take_while(|b| matches!(b, b'\n' | b'\r'))
            .count();
        let before = self.newlines.partition_point(|&n| n < start + breaks);
        u64::try_from(before).unwrap_or(u64::MAX) + 1
    }
}

fn unreadable(e: &csv::Error) -> Refusal {
    Refusal::Unreadable {
        line: e.position().map_or(0, csv::Position::line),
        why: e.to_string(),
    }
}

/// A row whose template would go out with a hole in it is left out.
fn empty_param(values: &[String], columns: &[String]) -> Option<(SkipReason, String)> {
    let (n, column) = values
        .iter()
        .zip(columns)
        .enumerate()
        .find(|(_, (value, _))| value.is_empty())
        .map(|(n, (_, column))| (n + 1, column))?;
    Some((
        SkipReason::Invalid,
        format!("no value for {{{{{n}}}}} (column {column})"),
    ))
}

/// `written` as E.164 digits: `+234 803-123 4567`, `00234...` and (with a default country)
/// `0803...` all become `2348031234567`.
///
/// # Errors
/// Why it is not a phone number, in words.
pub fn e164(written: &str, country: Option<&str>) -> Result<String, String> {
    let kept: String = written
        .chars()
        .filter(|c| !matches!(c, ' ' | '-' | '.' | '(' | ')' | '\u{a0}'))
        .collect();
    let (plus, digits) = match kept.strip_prefix('+') {
        Some(rest) => (true, rest),
        None => (false, kept.as_str()),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("{written:?} is not a phone number"));
    }
    let international = match digits.strip_prefix("00") {
        Some(rest) if !plus => rest.to_owned(),
        _ if plus => digits.to_owned(),
        _ => match (digits.strip_prefix('0'), country) {
            (Some(local), Some(code)) => format!("{code}{local}"),
            (Some(_), None) => {
                return Err(format!(
                    "{written:?} has no country code (write it as +<country><number>)"
                ));
            }
            (None, _) => digits.to_owned(),
        },
    };
    if international.starts_with('0') || !(8..=15).contains(&international.len()) {
        return Err(format!("{written:?} is not an international number"));
    }
    Ok(international)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn numbers_become_e164_digits() {
        let ng = Some("234");
        for (written, want) in [
            ("+234 803-123 4567", "2348031234567"),
            ("002348031234567", "2348031234567"),
            ("08031234567", "2348031234567"),
            ("(0803) 123.4567", "2348031234567"),
            ("2348031234567", "2348031234567"),
            ("+44 20 7946 0958", "442079460958"),
        ] {
            assert_eq!(e164(written, ng).as_deref(), Ok(want), "{written}");
        }
        for bad in [
            "",
            "call me",
            "+",
            "12345",
            "+0803123",
            "2348031234567890123",
        ] {
            assert!(e164(bad, ng).is_err(), "{bad}");
        }
        assert!(
            e164("08031234567", None).is_err(),
            "local, and no country to add"
        );
    }

    #[test]
    fn rows_keep_their_lines_and_bad_or_repeated_ones_are_skipped() {
        let csv = "name,Phone,city\n\
                   Ada,+2348031234567,Lagos\n\
                   Bola,not a number,Ibadan\n\
                   \n\
                   Chi,08031234567,Enugu\n\
                   Dayo,+2348039999999,\n";
        let rows = parse(csv, &params(&["name", "city"]), Some("234")).expect("parsed");
        let seen: Vec<(u64, &str, Option<SkipReason>)> = rows
            .iter()
            .map(|r| (r.line, r.to.as_str(), r.skipped.as_ref().map(|s| s.0)))
            .collect();
        assert_eq!(
            seen,
            [
                (2, "2348031234567", None),
                (3, "not a number", Some(SkipReason::Invalid)),
                (5, "2348031234567", Some(SkipReason::Duplicate)),
                (6, "2348039999999", Some(SkipReason::Invalid)),
            ]
        );
        assert_eq!(rows[0].params, ["Ada", "Lagos"]);
        assert_eq!(
            rows[2].skipped.as_ref().expect("skipped").1,
            "the same number as line 2"
        );
        assert_eq!(
            rows[3].skipped.as_ref().expect("skipped").1,
            "no value for {{2}} (column city)"
        );
    }

    #[test]
    fn parameters_meta_would_refuse_refuse_the_file_by_line_and_column() {
        let refused = |value: &str| {
            let csv =
                format!("phone,name,city\n+2348031234567,Ada,Lagos\n+2348039999999,Bola,{value}\n");
            parse(&csv, &params(&["name", "city"]), None)
                .expect_err("refused")
                .to_string()
        };
        assert_eq!(
            refused("\"Ikeja\nLagos\""),
            "line 3, column city: a template parameter may not hold a line break"
        );
        assert!(refused("Ikeja\tLagos").contains("tab"));
        assert!(refused("Ikeja     Lagos").contains("more than 4 spaces"));
        assert!(refused(&"x".repeat(1025)).contains("1025 characters"));
        // Four spaces, and a value of the longest length, are Meta's own limits: they pass.
        let csv = format!(
            "phone,name\n+2348031234567,Ada    Obi\n+2348039999999,{}\n",
            "y".repeat(1024)
        );
        assert!(parse(&csv, &params(&["name"]), None).is_ok());
        let listed_refusal = listed(
            [(
                "+2348031234567".to_owned(),
                vec!["ok".to_owned(), "a\nb".to_owned()],
                None,
            )],
            None,
        )
        .expect_err("refused")
        .to_string();
        assert_eq!(
            listed_refusal,
            "recipient 1, parameter {{2}}: a template parameter may not hold a line break"
        );
    }

    #[test]
    fn a_list_is_read_by_the_same_rules_with_its_places_as_lines() {
        let given = [
            ("+2348031234567", "Ada"),
            ("08031234567", "again"),
            ("nope", "Bola"),
        ];
        let rows = listed(
            given.map(|(to, name)| (to.to_owned(), vec![name.to_owned()], None)),
            Some("234"),
        )
        .expect("read");
        let seen: Vec<(u64, Option<SkipReason>)> = rows
            .iter()
            .map(|r| (r.line, r.skipped.as_ref().map(|s| s.0)))
            .collect();
        assert_eq!(
            seen,
            [
                (1, None),
                (2, Some(SkipReason::Duplicate)),
                (3, Some(SkipReason::Invalid))
            ]
        );
        assert_eq!(rows[0].to, "2348031234567");
    }

    #[test]
    fn a_recipients_zone_is_the_files_or_else_their_countrys() {
        let csv = "phone,tz\n+2348031234567,\n+447700900123,Asia/Kolkata\n\
                   +15551234567,\n+2348039999999,Lagos/Ikeja\n";
        let rows = parse(csv, &[], None).expect("parsed");
        let zones: Vec<Option<&str>> = rows.iter().map(|r| r.tz.as_deref()).collect();
        assert_eq!(
            zones,
            [Some("Africa/Lagos"), Some("Asia/Kolkata"), None, None]
        );
        let (reason, why) = rows[3].skipped.clone().expect("left out");
        assert_eq!((reason, rows[3].line), (SkipReason::Invalid, 5));
        assert!(why.contains("Lagos/Ikeja"), "{why}");
    }

    #[test]
    fn a_file_that_cannot_be_used_is_refused_whole() {
        assert!(matches!(
            parse("name,city\nAda,Lagos\n", &[], None),
            Err(Refusal::NoPhoneColumn(columns)) if columns == "name, city"
        ));
        assert!(matches!(
            parse("wa_id\n2348031234567\n", &params(&["name"]), None),
            Err(Refusal::NoSuchColumn { name, .. }) if name == "name"
        ));
        assert_eq!(parse("phone\n", &[], None), Err(Refusal::Empty));
        let ragged = "phone,name\n2348031234567,Ada\n2348039999999,Bola,extra\n";
        assert!(matches!(
            parse(ragged, &[], None),
            Err(Refusal::Unreadable { line: 3, .. })
        ));
    }
}
