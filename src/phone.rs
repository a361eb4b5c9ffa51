//! Phone numbers as people write them, read as the E.164 digits WhatsApp names customers by:
//! audience files, the customer a person asks to export or erase, and the country settings.

/// A country calling code as [`e164`] takes it: `234` or `+234` is `234`.
///
/// # Errors
/// Why it is not one, in words.
pub fn country_code(written: &str) -> Result<String, String> {
    let digits = written.trim().trim_start_matches('+');
    let is_code = (1..=3).contains(&digits.len())
        && digits.chars().all(|c| c.is_ascii_digit())
        && !digits.starts_with('0');
    if !is_code {
        return Err(format!(
            "{written:?} is not a country calling code: 1 to 3 digits, like 234 or 44"
        ));
    }
    Ok(digits.to_owned())
}

/// `written` as E.164 digits: `+234 803-123 4567`, `00234...` and (with a default country)
/// `0803...` all become `2348031234567`.
///
/// # Errors
/// Why it is not a phone number, in words.
pub fn e164(written: &str, country: Option<&str>) -> Result<String, String> {
    // "+44 (0)20 ..." writes the trunk 0 that a call from abroad leaves out.
    let kept: String = written
        .replace("(0)", "")
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
                    "{written:?} is a local number: give its country with --country (like 234) \
                     or whatsapp.default_country"
                ));
            }
            (None, _) => digits.to_owned(),
        },
    };
    if international.starts_with('0') || !(7..=15).contains(&international.len()) {
        return Err(format!("{written:?} is not an international number"));
    }
    Ok(international)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            ("+44 (0)20 7946 0958", "442079460958"),
            ("+683 4123", "6834123"),
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
    fn a_country_code_is_one_to_three_digits() {
        assert_eq!(country_code("+234").as_deref(), Ok("234"));
        assert_eq!(country_code("1").as_deref(), Ok("1"));
        for bad in ["", "+", "0", "044", "2345", "NG", "23a"] {
            let why = country_code(bad).expect_err(bad);
            assert!(why.contains("not a country calling code"), "{why}");
        }
    }
}
