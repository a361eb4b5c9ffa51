//! A broadcast's audience from a CSV file: who gets it, with which template parameters, and who
//! is left out and why, by the file's line numbers.
//!
//! The file is read as people export it: its separator (`,` `;` tab `|`) is the one its header
//! line uses most, outside quotes (a spreadsheet set to a European locale writes `;`); a
//! byte-order mark, CRLF line ends and blank lines are taken in stride. The recipient's column
//! is the one the caller names, or the one whose header is a usual name for a phone number
//! (`phone`, `wa_id`, `Phone Number`, `mobile`, `msisdn`, `whatsapp`, `tel`, ...); headers are
//! matched ignoring case, spaces, `_` and `-`. Each parameter column fills the template's next
//! body parameter ({{1}}, {{2}}, ...). A `tz` (or `time_zone`) column may give a recipient's
//! IANA time zone; without one it is their country's, when that has a single zone ([`zones`]).
//! Numbers become E.164 digits (no `+`, spaces or punctuation); a number written the local way
//! (a leading trunk `0`) takes the default country code when one is given. A file that cannot
//! be read as such (no header, no phone column or two, a parameter column it lacks, broken CSV)
//! is refused whole, naming the columns found and the separator; a bad row (an invalid number,
//! an empty parameter, an unknown zone) or a repeated number is kept as skipped, with its
//! reason and line. A parameter Meta would refuse when the template goes out (a line break, a
//! tab, more than four spaces in a row, longer than a template body can be) refuses the whole
//! file, naming its line and column, before anything is sent.
//!
//! PURE: no IO.

use std::collections::HashMap;

use crate::broadcast::zones;
use crate::phone::e164;
use crate::store::rules::broadcast::SkipReason;
use crate::store::rules::hours::{unknown_zone, zone};

/// Headers that name the recipient's number, as [`normalised`]: what CRMs, spreadsheets and
/// Meta's own exports call it.
const PHONE_COLUMNS: [&str; 9] = [
    "phone",
    "waid",
    "phonenumber",
    "mobile",
    "mobilenumber",
    "msisdn",
    "whatsapp",
    "whatsappnumber",
    "tel",
];

/// The columns that may give the recipient's time zone, as [`normalised`].
const ZONE_COLUMNS: [&str; 2] = ["tz", "timezone"];

/// The separators an audience file may use, the most usual first (it wins a tie).
const SEPARATORS: [u8; 4] = [b',', b';', b'\t', b'|'];

/// Where the advice to name the phone column points, on the command line and in the admin API.
const NAME_IT: &str = "name it with --phone-column (phone_column in the admin API)";

/// A file's field separator, shown as people read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Separator(u8);

impl std::fmt::Display for Separator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            b'\t' => f.write_str("tabs"),
            c => write!(f, "'{}'", char::from(c)),
        }
    }
}

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

/// Why a file is refused: nothing of it is kept. `columns` lists the header as found, with its
/// separator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the audience file has no rows")]
    Empty,
    #[error("the audience file has no phone column among {0}; {NAME_IT}")]
    NoPhoneColumn(String),
    #[error(
        "the audience file has more than one phone column ({found}) among {columns}; {NAME_IT}"
    )]
    ManyPhoneColumns { found: String, columns: String },
    #[error("the audience file has no column {name:?} {purpose}; it has {columns}")]
    NoSuchColumn {
        name: String,
        purpose: &'static str,
        columns: String,
    },
    #[error("the audience file (separated by {separator}) is not CSV at line {line}: {why}")]
    Unreadable {
        line: u64,
        separator: Separator,
        why: String,
    },
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

/// How a file names its columns.
struct Header {
    /// As written, for messages.
    names: Vec<String>,
    /// As [`normalised`], for matching.
    keys: Vec<String>,
    separator: Separator,
}

impl Header {
    fn of(record: &csv::StringRecord, separator: Separator) -> Header {
        let names: Vec<String> = record.iter().map(str::to_owned).collect();
        let keys = names.iter().map(|n| normalised(n)).collect();
        Header {
            names,
            keys,
            separator,
        }
    }

    /// The columns found, and how they are separated: what a person needs to fix the file.
    fn shown(&self) -> String {
        format!(
            "{} (separated by {})",
            self.names.join(", "),
            self.separator
        )
    }

    fn find(&self, name: &str) -> Option<usize> {
        let key = normalised(name);
        self.keys.iter().position(|k| *k == key)
    }

    /// The column `purpose` names, or a refusal saying which columns there are.
    fn named(&self, name: &str, purpose: &'static str) -> Result<usize, Refusal> {
        self.find(name).ok_or_else(|| Refusal::NoSuchColumn {
            name: name.to_owned(),
            purpose,
            columns: self.shown(),
        })
    }

    /// The recipient's column: the one named, else the one usual phone header. Two such
    /// headers are refused rather than guessed between: a broadcast to the wrong column reaches
    /// the wrong people.
    fn phone(&self, named: Option<&str>) -> Result<usize, Refusal> {
        if let Some(name) = named {
            return self.named(name, "for --phone-column");
        }
        let found: Vec<usize> = (0..self.keys.len())
            .filter(|&i| PHONE_COLUMNS.contains(&self.keys[i].as_str()))
            .collect();
        match found.as_slice() {
            [one] => Ok(*one),
            [] => Err(Refusal::NoPhoneColumn(self.shown())),
            many => Err(Refusal::ManyPhoneColumns {
                found: many
                    .iter()
                    .map(|&i| self.names[i].as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                columns: self.shown(),
            }),
        }
    }
}

/// A header as matched: `Phone Number`, `phone_number` and `PHONE-NUMBER` are one name.
fn normalised(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, ' ' | '_' | '-'))
        .flat_map(char::to_lowercase)
        .collect()
}

/// The separator the header line (up to its first line end outside quotes) uses most.
fn sniff(text: &str) -> Separator {
    let mut counts = [0usize; SEPARATORS.len()];
    let mut quoted = false;
    for byte in text.bytes() {
        match byte {
            b'"' => quoted = !quoted,
            b'\n' | b'\r' if !quoted => break,
            _ if quoted => {}
            _ => {
                if let Some(i) = SEPARATORS.iter().position(|&s| s == byte) {
                    counts[i] += 1;
                }
            }
        }
    }
    // The first of the most used: a header with none (one column) is comma-separated.
    let best = (0..SEPARATORS.len())
        .rev()
        .max_by_key(|&i| counts[i])
        .unwrap_or(0);
    Separator(SEPARATORS[best])
}

/// The rows of `csv`, each parameter taken from the named `columns` in order, the recipient
/// from `phone_column` (or the usual phone header), local numbers with `country`.
///
/// # Errors
/// [`Refusal`] when the file as a whole cannot be used.
pub fn parse(
    csv: &str,
    columns: &[String],
    country: Option<&str>,
    phone_column: Option<&str>,
) -> Result<Vec<Row>, Refusal> {
    let csv = csv.strip_prefix('\u{feff}').unwrap_or(csv);
    if csv.trim().is_empty() {
        return Err(Refusal::Empty);
    }
    let separator = sniff(csv);
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(separator.0)
        .trim(csv::Trim::All)
        .from_reader(csv.as_bytes());
    let header = Header::of(
        reader.headers().map_err(|e| unreadable(&e, separator))?,
        separator,
    );
    let phone = header.phone(phone_column)?;
    let zone_column = ZONE_COLUMNS.iter().find_map(|name| header.find(name));
    let params = columns
        .iter()
        .map(|name| header.named(name, "for a template parameter"))
        .collect::<Result<Vec<_>, _>>()?;
    let lines = Lines::of(csv);
    let mut rows = Vec::new();
    let mut first_line: HashMap<String, u64> = HashMap::new();
    for record in reader.records() {
        let record = record.map_err(|e| unreadable(&e, separator))?;
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

fn unreadable(e: &csv::Error, separator: Separator) -> Refusal {
    Refusal::Unreadable {
        line: e.position().map_or(0, csv::Position::line),
        separator,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn params(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn rows_keep_their_lines_and_bad_or_repeated_ones_are_skipped() {
        let csv = "name,Phone,city\n\
                   Ada,+2348031234567,Lagos\n\
                   Bola,not a number,Ibadan\n\
                   \n\
                   Chi,08031234567,Enugu\n\
                   Dayo,+2348039999999,\n";
        let rows = parse(csv, &params(&["name", "city"]), Some("234"), None).expect("parsed");
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
            parse(&csv, &params(&["name", "city"]), None, None)
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
        assert!(parse(&csv, &params(&["name"]), None, None).is_ok());
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
        let rows = parse(csv, &[], None, None).expect("parsed");
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
            parse("name,city\nAda,Lagos\n", &[], None, None),
            Err(Refusal::NoPhoneColumn(columns)) if columns == "name, city (separated by ',')"
        ));
        assert!(matches!(
            parse("wa_id\n2348031234567\n", &params(&["name"]), None, None),
            Err(Refusal::NoSuchColumn { name, .. }) if name == "name"
        ));
        assert_eq!(parse("phone\n", &[], None, None), Err(Refusal::Empty));
        let ragged = "phone,name\n2348031234567,Ada\n2348039999999,Bola,extra\n";
        assert!(matches!(
            parse(ragged, &[], None, None),
            Err(Refusal::Unreadable { line: 3, .. })
        ));
    }

    /// The recipients' numbers of a file read with no parameters.
    fn numbers(csv: &str, phone_column: Option<&str>) -> Result<Vec<String>, Refusal> {
        parse(csv, &[], Some("234"), phone_column)
            .map(|rows| rows.into_iter().map(|r| r.to).collect())
    }

    #[test]
    fn the_separator_is_the_one_the_header_uses_outside_quotes() {
        for (csv, phone_column) in [
            ("phone,name\n08031234567,Ada\n", None),
            ("phone;name;offer\n08031234567;Ada;\"10,5 %\"\n", None),
            ("phone\tname\n08031234567\tAda\n", None),
            ("phone|name\n08031234567|Ada\n", None),
            // The commas inside the quoted header do not count: the file is ';'-separated.
            (
                "\"number, with code\";name\n08031234567;Ada\n",
                Some("number, with code"),
            ),
        ] {
            assert_eq!(
                numbers(csv, phone_column),
                Ok(vec!["2348031234567".to_owned()]),
                "{csv:?}"
            );
        }
        assert_eq!(sniff("phone"), Separator(b','), "one column: commas");
        assert_eq!(sniff("a;b,c"), Separator(b','), "a tie: the usual one");
    }

    #[test]
    fn usual_phone_headers_are_found_whatever_their_case_and_spacing() {
        for header in [
            "phone",
            "WA_ID",
            "Phone Number",
            "phone_number",
            "Mobile",
            "MSISDN",
            "WhatsApp",
            "tel",
            "WhatsApp Number",
            "mobile-number",
        ] {
            let csv = format!("name,{header}\nAda,08031234567\n");
            assert_eq!(
                numbers(&csv, None),
                Ok(vec!["2348031234567".to_owned()]),
                "{header}"
            );
        }
    }

    #[test]
    fn a_named_phone_column_is_used_and_a_missing_one_is_named() {
        let csv = "name;offer;number\nAda;10 %;08031234567\n";
        assert_eq!(
            parse(csv, &[], None, None)
                .expect_err("no usual header")
                .to_string(),
            "the audience file has no phone column among name, offer, number (separated by ';'); \
             name it with --phone-column (phone_column in the admin API)"
        );
        assert_eq!(
            numbers(csv, Some("Number")),
            Ok(vec!["2348031234567".to_owned()])
        );
        assert_eq!(
            parse(csv, &[], None, Some("cell"))
                .expect_err("no such column")
                .to_string(),
            "the audience file has no column \"cell\" for --phone-column; it has name, offer, \
             number (separated by ';')"
        );
        let both = "phone\tmobile\n08031234567\t08039999999\n";
        let refused = parse(both, &[], None, None).expect_err("two phone columns");
        assert_eq!(
            refused.to_string(),
            "the audience file has more than one phone column (phone, mobile) among phone, \
             mobile (separated by tabs); name it with --phone-column (phone_column in the admin \
             API)"
        );
        assert_eq!(
            numbers(both, Some("mobile")),
            Ok(vec!["2348039999999".to_owned()])
        );
    }

    #[test]
    fn a_bom_crlf_line_ends_and_blank_trailing_lines_are_taken_in_stride() {
        let csv = "\u{feff}Phone Number;First Name\r\n08031234567;Ada\r\n\r\n08039999999;Bola\r\n\r\n\r\n";
        let rows = parse(csv, &params(&["first_name"]), Some("234"), None).expect("parsed");
        let seen: Vec<(u64, &str, &str)> = rows
            .iter()
            .map(|r| (r.line, r.to.as_str(), r.params[0].as_str()))
            .collect();
        assert_eq!(
            seen,
            [(2, "2348031234567", "Ada"), (4, "2348039999999", "Bola")]
        );
        assert_eq!(
            parse("\u{feff}\r\n\r\n", &[], None, None),
            Err(Refusal::Empty)
        );
    }

    #[test]
    fn a_missing_parameter_column_names_the_columns_and_the_separator() {
        let refused = parse(
            "phone|name\n08031234567|Ada\n",
            &params(&["offer"]),
            None,
            None,
        )
        .expect_err("no offer column");
        assert_eq!(
            refused.to_string(),
            "the audience file has no column \"offer\" for a template parameter; it has phone, \
             name (separated by '|')"
        );
        let ragged = parse("phone;name\n08031234567;Ada;x\n", &[], None, None)
            .expect_err("ragged")
            .to_string();
        assert!(
            ragged.contains("separated by ';'") && ragged.contains("line 2"),
            "{ragged}"
        );
    }
}
