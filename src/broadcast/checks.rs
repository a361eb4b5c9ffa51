//! What a broadcast's request can be told wrong before anything is asked of Meta, so that a
//! rehearsal in sandbox fails where the real day would: the template's name and language code
//! by Meta's rules, the business number's id, the pace asked against the number's, and a start
//! or deadline already past. Pure: each check returns the field and why.

use crate::clock::At;
use crate::export;

/// A field of a broadcast's request, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct Mistake {
    pub field: &'static str,
    pub why: String,
}

fn mistake(field: &'static str, why: impl Into<String>) -> Mistake {
    Mistake {
        field,
        why: why.into(),
    }
}

/// Meta's template language codes, with the language's name in English: a code Meta does not
/// list is refused there at send time, after the broadcast was kept.
const LANGUAGES: &[(&str, &str)] = &[
    ("af", "Afrikaans"),
    ("sq", "Albanian"),
    ("ar", "Arabic"),
    ("ar_EG", "Arabic (Egypt)"),
    ("ar_AE", "Arabic (UAE)"),
    ("ar_LB", "Arabic (Lebanon)"),
    ("ar_MA", "Arabic (Morocco)"),
    ("ar_QA", "Arabic (Qatar)"),
    ("az", "Azerbaijani"),
    ("be_BY", "Belarusian"),
    ("bn", "Bengali"),
    ("bn_IN", "Bengali (India)"),
    ("bg", "Bulgarian"),
    ("ca", "Catalan"),
    ("zh_CN", "Chinese (China)"),
    ("zh_HK", "Chinese (Hong Kong)"),
    ("zh_TW", "Chinese (Taiwan)"),
    ("hr", "Croatian"),
    ("cs", "Czech"),
    ("da", "Danish"),
    ("prs_AF", "Dari"),
    ("nl", "Dutch"),
    ("nl_BE", "Dutch (Belgium)"),
    ("en", "English"),
    ("en_GB", "English (UK)"),
    ("en_US", "English (US)"),
    ("en_AE", "English (UAE)"),
    ("en_AU", "English (Australia)"),
    ("en_CA", "English (Canada)"),
    ("en_GH", "English (Ghana)"),
    ("en_IE", "English (Ireland)"),
    ("en_IN", "English (India)"),
    ("en_JM", "English (Jamaica)"),
    ("en_MY", "English (Malaysia)"),
    ("en_NZ", "English (New Zealand)"),
    ("en_QA", "English (Qatar)"),
    ("en_SG", "English (Singapore)"),
    ("en_UG", "English (Uganda)"),
    ("en_ZA", "English (South Africa)"),
    ("et", "Estonian"),
    ("fil", "Filipino"),
    ("fi", "Finnish"),
    ("fr", "French"),
    ("fr_BE", "French (Belgium)"),
    ("fr_CA", "French (Canada)"),
    ("fr_CH", "French (Switzerland)"),
    ("fr_CI", "French (Côte d'Ivoire)"),
    ("fr_MA", "French (Morocco)"),
    ("ka", "Georgian"),
    ("de", "German"),
    ("de_AT", "German (Austria)"),
    ("de_CH", "German (Switzerland)"),
    ("el", "Greek"),
    ("gu", "Gujarati"),
    ("ha", "Hausa"),
    ("he", "Hebrew"),
    ("hi", "Hindi"),
    ("hu", "Hungarian"),
    ("id", "Indonesian"),
    ("ga", "Irish"),
    ("it", "Italian"),
    ("ja", "Japanese"),
    ("kn", "Kannada"),
    ("kk", "Kazakh"),
    ("rw_RW", "Kinyarwanda"),
    ("ko", "Korean"),
    ("ky_KG", "Kyrgyz"),
    ("lo", "Lao"),
    ("lv", "Latvian"),
    ("lt", "Lithuanian"),
    ("mk", "Macedonian"),
    ("ms", "Malay"),
    ("ml", "Malayalam"),
    ("mr", "Marathi"),
    ("nb", "Norwegian"),
    ("ps_AF", "Pashto"),
    ("fa", "Persian"),
    ("pl", "Polish"),
    ("pt_BR", "Portuguese (Brazil)"),
    ("pt_PT", "Portuguese (Portugal)"),
    ("pa", "Punjabi"),
    ("ro", "Romanian"),
    ("ru", "Russian"),
    ("sr", "Serbian"),
    ("si_LK", "Sinhala"),
    ("sk", "Slovak"),
    ("sl", "Slovenian"),
    ("es", "Spanish"),
    ("es_AR", "Spanish (Argentina)"),
    ("es_CL", "Spanish (Chile)"),
    ("es_CO", "Spanish (Colombia)"),
    ("es_CR", "Spanish (Costa Rica)"),
    ("es_DO", "Spanish (Dominican Republic)"),
    ("es_EC", "Spanish (Ecuador)"),
    ("es_HN", "Spanish (Honduras)"),
    ("es_MX", "Spanish (Mexico)"),
    ("es_PA", "Spanish (Panama)"),
    ("es_PE", "Spanish (Peru)"),
    ("es_ES", "Spanish (Spain)"),
    ("es_UY", "Spanish (Uruguay)"),
    ("sw", "Swahili"),
    ("sv", "Swedish"),
    ("ta", "Tamil"),
    ("te", "Telugu"),
    ("th", "Thai"),
    ("tr", "Turkish"),
    ("uk", "Ukrainian"),
    ("ur", "Urdu"),
    ("uz", "Uzbek"),
    ("vi", "Vietnamese"),
    ("zu", "Zulu"),
];

/// Meta's rule for template names: lowercase letters, digits and underscores, 512 at most.
const NAME_MAX: usize = 512;

/// The template's name as Meta allows it.
///
/// # Errors
/// A [`Mistake`] of `template` saying what is wrong.
pub fn template_name(name: &str) -> Result<(), Mistake> {
    let field = "template";
    if name.is_empty() {
        return Err(mistake(field, "the template's name is empty"));
    }
    if name.len() > NAME_MAX {
        return Err(mistake(
            field,
            format!("{} characters; Meta allows {NAME_MAX} at most", name.len()),
        ));
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
    {
        None => Ok(()),
        Some(c) => Err(mistake(
            field,
            format!(
                "{name:?} has {c:?}: Meta's template names are lowercase letters, digits and \
                 underscores, like {:?}",
                suggested_name(name)
            ),
        )),
    }
}

fn suggested_name(name: &str) -> String {
    name.trim()
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c if c.is_ascii_lowercase() || c.is_ascii_digit() => c,
            _ => '_',
        })
        .collect()
}

/// The language code is one of Meta's template languages.
///
/// # Errors
/// A [`Mistake`] of `language`, naming the code meant when one is close (a language's name,
/// a hyphen for the underscore, another case).
pub fn language(code: &str) -> Result<(), Mistake> {
    if LANGUAGES.iter().any(|(known, _)| *known == code) {
        return Ok(());
    }
    let meant = close_language(code).map_or_else(
        || "; see Meta's list of template languages (en, en_US, pt_BR, ...)".to_owned(),
        |(known, name)| format!("; {name} is {known}"),
    );
    Err(mistake(
        "language",
        format!("{code:?} is not one of Meta's template language codes{meant}"),
    ))
}

fn close_language(code: &str) -> Option<(&'static str, &'static str)> {
    let asked = code.trim().replace('-', "_").to_ascii_lowercase();
    LANGUAGES.iter().copied().find(|(known, name)| {
        known.to_ascii_lowercase() == asked || name.to_ascii_lowercase() == asked
    })
}

/// `--from` is a phone-number id (Meta's digits for the business number), not the number.
///
/// # Errors
/// A [`Mistake`] of `from`; a phone number given there is named as the mistake.
pub fn phone_number_id(from: &str) -> Result<(), Mistake> {
    let field = "from";
    if !from.is_empty() && from.chars().all(|c| c.is_ascii_digit()) {
        return Ok(());
    }
    let written_as_number = from
        .chars()
        .all(|c| c.is_ascii_digit() || " +-().".contains(c))
        && from.chars().any(|c| c.is_ascii_digit());
    let why = match written_as_number {
        true => format!(
            "{from:?} is a phone number; --from takes the phone-number id from WhatsApp Manager \
             (digits, like 106540352242922)"
        ),
        false => format!(
            "{from:?} is not a phone-number id: give the digits WhatsApp Manager shows as the \
             number's id, like 106540352242922"
        ),
    };
    Err(mistake(field, why))
}

/// The pace a broadcast really goes at: what was asked, at most the number's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub rate: u32,
    /// What was asked, when it was above the number's pace.
    pub capped_from: Option<u32>,
}

impl Pace {
    /// Says why the rate is lower than asked, when it is.
    pub fn note(self) -> Option<String> {
        let asked = self.capped_from?;
        Some(format!(
            "rate: {asked} a second is above the number's pace (whatsapp.outbound_rate, {} a \
             second, which replies to customers share): the broadcast goes at {}",
            self.rate, self.rate
        ))
    }
}

/// `asked` messages a second on a number whose pace is `number` a second.
///
/// # Errors
/// A [`Mistake`] of `rate` when it is 0.
pub fn pace(asked: u32, number: u32) -> Result<Pace, Mistake> {
    if asked == 0 {
        return Err(mistake(
            "rate",
            "0 messages a second sends nothing: give 1 or more",
        ));
    }
    Ok(match asked > number {
        true => Pace {
            rate: number.max(1),
            capped_from: Some(asked),
        },
        false => Pace {
            rate: asked,
            capped_from: None,
        },
    })
}

/// A start or deadline already past sends at once or cancels at once: refused instead.
///
/// # Errors
/// A [`Mistake`] of `field` saying how long ago it was.
pub fn not_past(field: &'static str, when: At, now: At) -> Result<(), Mistake> {
    if when.millis() > export::LAST_MILLI {
        return Err(mistake(
            field,
            format!(
                "{} ms since the epoch is after the year 9999",
                when.millis()
            ),
        ));
    }
    if when >= now {
        return Ok(());
    }
    let what = match field {
        "until" => "the deadline",
        _ => "the start",
    };
    Err(mistake(
        field,
        format!(
            "{what} ({}) was {} ago: give a time to come",
            rfc3339(when),
            roughly(now.since(when))
        ),
    ))
}

/// A span in its largest whole unit: "22 days", "3 hours", "1 minute".
fn roughly(span: std::time::Duration) -> String {
    let secs = span.as_secs();
    let (n, unit) = [(86_400, "day"), (3_600, "hour"), (60, "minute")]
        .into_iter()
        .find(|(size, _)| secs >= *size)
        .map_or((secs, "second"), |(size, unit)| (secs / size, unit));
    match n {
        1 => format!("1 {unit}"),
        n => format!("{n} {unit}s"),
    }
}

/// A time as people read it, to the minute, in UTC.
pub fn rfc3339(at: At) -> String {
    let text = export::rfc3339(at);
    // 2027-02-14T18:00:00.000Z -> 2027-02-14 18:00 UTC
    format!("{} {} UTC", &text[..10], &text[11..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_names_follow_metas_rule() {
        assert!(template_name("diwali_offer_2").is_ok());
        for (bad, says) in [
            ("", "empty"),
            ("Diwali Offer", "\"diwali_offer\""),
            ("offer-1", "'-'"),
        ] {
            let e = template_name(bad).expect_err("refused");
            assert_eq!(e.field, "template");
            assert!(e.why.contains(says), "{bad:?}: {}", e.why);
        }
        assert!(template_name(&"a".repeat(513)).is_err());
        assert!(template_name(&"a".repeat(512)).is_ok());
    }

    #[test]
    fn language_codes_are_metas_and_the_close_one_is_named() {
        for good in ["en", "en_US", "pt_BR", "fil", "prs_AF"] {
            assert!(language(good).is_ok(), "{good}");
        }
        for (bad, meant) in [
            ("english", "English is en"),
            ("en-US", "English (US) is en_US"),
            ("PT_br", "Portuguese (Brazil) is pt_BR"),
        ] {
            let e = language(bad).expect_err("refused");
            assert_eq!(e.field, "language");
            assert!(e.why.contains(meant), "{bad}: {}", e.why);
        }
        assert!(
            language("klingon")
                .expect_err("refused")
                .why
                .contains("Meta's list")
        );
    }

    #[test]
    fn from_takes_an_id_and_names_a_phone_number_as_the_mistake() {
        assert!(phone_number_id("106540352242922").is_ok());
        let e = phone_number_id("+234 803 000 0000").expect_err("refused");
        assert!(
            e.why
                .contains("is a phone number; --from takes the phone-number id")
        );
        let e = phone_number_id("my-shop").expect_err("refused");
        assert!(e.why.contains("not a phone-number id"), "{}", e.why);
        assert!(phone_number_id("").is_err());
    }

    #[test]
    fn the_pace_is_never_zero_nor_above_the_numbers() {
        assert_eq!(pace(0, 80).expect_err("refused").field, "rate");
        assert_eq!(
            pace(20, 80).expect("taken"),
            Pace {
                rate: 20,
                capped_from: None
            }
        );
        let capped = pace(1000, 80).expect("taken");
        assert_eq!(capped.rate, 80);
        assert!(
            capped
                .note()
                .expect("taken")
                .contains("whatsapp.outbound_rate, 80 a second")
        );
        assert_eq!(pace(20, 80).expect("taken").note(), None);
    }

    #[test]
    fn a_past_time_is_refused_with_how_long_ago() {
        let now = At::from_millis(1_800_000_000_000);
        assert!(not_past("at", now, now).is_ok());
        let e = not_past(
            "at",
            now - std::time::Duration::from_secs(22 * 86_400 + 600),
            now,
        );
        assert!(e.expect_err("past").why.contains("was 22 days ago"));
        let e = not_past("until", now - std::time::Duration::from_secs(7200), now)
            .expect_err("refused");
        assert_eq!(e.field, "until");
        assert!(
            e.why
                .contains("the deadline (2027-01-15 06:00 UTC) was 2 hours ago"),
            "{}",
            e.why
        );
    }
}
