//! A recipient's time zone from their number, where the country has one: `234...` is Nigeria,
//! on Africa/Lagos. Countries spanning several zones (+1, +7, +52, +55, +61, +62, ...) give
//! none, and their recipients read the broadcast's zone unless the audience names their own.
//!
//! PURE: no IO.

/// Country calling codes of single-zone countries, with their IANA zone. Calling codes are
/// prefix-free, so at most one of these starts a number.
const SINGLE_ZONE: &[(&str, &str)] = &[
    // Africa
    ("20", "Africa/Cairo"),
    ("27", "Africa/Johannesburg"),
    ("211", "Africa/Juba"),
    ("212", "Africa/Casablanca"),
    ("213", "Africa/Algiers"),
    ("216", "Africa/Tunis"),
    ("218", "Africa/Tripoli"),
    ("220", "Africa/Banjul"),
    ("221", "Africa/Dakar"),
    ("223", "Africa/Bamako"),
    ("224", "Africa/Conakry"),
    ("225", "Africa/Abidjan"),
    ("226", "Africa/Ouagadougou"),
    ("227", "Africa/Niamey"),
    ("228", "Africa/Lome"),
    ("229", "Africa/Porto-Novo"),
    ("231", "Africa/Monrovia"),
    ("232", "Africa/Freetown"),
    ("233", "Africa/Accra"),
    ("234", "Africa/Lagos"),
    ("235", "Africa/Ndjamena"),
    ("237", "Africa/Douala"),
    ("250", "Africa/Kigali"),
    ("251", "Africa/Addis_Ababa"),
    ("254", "Africa/Nairobi"),
    ("255", "Africa/Dar_es_Salaam"),
    ("256", "Africa/Kampala"),
    ("260", "Africa/Lusaka"),
    ("263", "Africa/Harare"),
    ("265", "Africa/Blantyre"),
    // Europe
    ("30", "Europe/Athens"),
    ("31", "Europe/Amsterdam"),
    ("32", "Europe/Brussels"),
    ("33", "Europe/Paris"),
    ("36", "Europe/Budapest"),
    ("39", "Europe/Rome"),
    ("40", "Europe/Bucharest"),
    ("41", "Europe/Zurich"),
    ("43", "Europe/Vienna"),
    ("44", "Europe/London"),
    ("45", "Europe/Copenhagen"),
    ("46", "Europe/Stockholm"),
    ("47", "Europe/Oslo"),
    ("48", "Europe/Warsaw"),
    ("49", "Europe/Berlin"),
    ("353", "Europe/Dublin"),
    ("90", "Europe/Istanbul"),
    // Asia
    ("60", "Asia/Kuala_Lumpur"),
    ("63", "Asia/Manila"),
    ("65", "Asia/Singapore"),
    ("66", "Asia/Bangkok"),
    ("81", "Asia/Tokyo"),
    ("82", "Asia/Seoul"),
    ("84", "Asia/Ho_Chi_Minh"),
    ("86", "Asia/Shanghai"),
    ("91", "Asia/Kolkata"),
    ("92", "Asia/Karachi"),
    ("94", "Asia/Colombo"),
    ("98", "Asia/Tehran"),
    ("880", "Asia/Dhaka"),
    ("965", "Asia/Kuwait"),
    ("966", "Asia/Riyadh"),
    ("968", "Asia/Muscat"),
    ("971", "Asia/Dubai"),
    ("972", "Asia/Jerusalem"),
    ("973", "Asia/Bahrain"),
    ("974", "Asia/Qatar"),
    ("977", "Asia/Kathmandu"),
    // The Americas
    ("51", "America/Lima"),
    ("54", "America/Argentina/Buenos_Aires"),
    ("57", "America/Bogota"),
    ("58", "America/Caracas"),
];

/// The zone of an E.164 number's country, when it has just one.
pub fn of_number(e164: &str) -> Option<&'static str> {
    (1..=3)
        .filter_map(|n| e164.get(..n))
        .find_map(|code| SINGLE_ZONE.iter().find(|(c, _)| *c == code))
        .map(|(_, zone)| *zone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rules::hours::zone;

    #[test]
    fn a_single_zone_country_gives_its_zone_and_others_none() {
        assert_eq!(of_number("2348031234567"), Some("Africa/Lagos"));
        assert_eq!(of_number("447700900123"), Some("Europe/London"));
        assert_eq!(of_number("919876543210"), Some("Asia/Kolkata"));
        assert_eq!(
            of_number("15551234567"),
            None,
            "the US and Canada span zones"
        );
        assert_eq!(of_number("5511912345678"), None, "so does Brazil");
    }

    #[test]
    fn every_zone_named_is_in_the_bundled_database() {
        for (code, name) in SINGLE_ZONE {
            assert!(zone(name).is_some(), "+{code}: {name}");
        }
    }
}
