//! The time zone a schedule's wall times are read in: an IANA zone, kept and shown by its name.
//!
//! A zone is never an offset: an offset has no daylight-saving rules, so a routine stored with one
//! would drift by an hour twice a year. [`Zone::parse`] refuses one with a [`ZoneError`].

use std::fmt;

/// An IANA time zone, stored and shown by its name (never as an offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Zone(chrono_tz::Tz);

/// A zone name that is not an IANA zone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown time zone {0:?} (expected an IANA name such as Europe/Berlin, not an offset)")]
pub struct ZoneError(pub String);

impl Zone {
    /// Coordinated Universal Time, the default zone.
    pub const UTC: Zone = Zone(chrono_tz::Tz::UTC);

    /// The zone named `name` (for example `Europe/Berlin`).
    ///
    /// Names are matched exactly, as the IANA database spells them. A raw offset such as
    /// `+02:00` or `UTC+2` is refused: an offset has no daylight-saving rules, so a routine
    /// stored with one would silently drift by an hour twice a year. `Etc/GMT+5` is an IANA name
    /// (with the POSIX sign convention) and is accepted.
    pub fn parse(name: &str) -> Result<Self, ZoneError> {
        name.parse::<chrono_tz::Tz>()
            .map(Zone)
            .map_err(|_| ZoneError(name.to_owned()))
    }

    /// The zone's IANA name.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// The chrono-tz zone.
    pub fn tz(&self) -> chrono_tz::Tz {
        self.0
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::testing::check;
    use crate::schedule::{Schedule, ScheduleError};

    /// Asserts that the zone name is refused.
    #[track_caller]
    fn check_zone_err(zone: &str) {
        let err = Schedule::parse("0 0 * * *", zone).unwrap_err();
        assert!(matches!(err, ScheduleError::Zone(_)), "{zone:?}: {err}");
        assert!(err.to_string().contains("unknown time zone"), "{err}");
    }

    #[test]
    fn accepts_and_refuses_zones() {
        check("0 0 * * *", "UTC", true);
        check("0 0 * * *", "Europe/London", true);
        check("0 0 * * *", "Australia/Lord_Howe", true);
        check("0 0 * * *", "Etc/GMT+5", true);
        check("0 0 * * *", "America/Argentina/Buenos_Aires", true);
        check_zone_err("+02:00");
        check_zone_err("UTC+2");
        check_zone_err("GMT+5");
        check_zone_err("Mars/Olympus_Mons");
        check_zone_err("");
        check_zone_err("Europe/Berlin ");
    }

    #[test]
    fn zone_keeps_its_name() {
        let zone = Zone::parse("Europe/Berlin").unwrap();
        assert_eq!(zone.name(), "Europe/Berlin");
        assert_eq!(zone.to_string(), "Europe/Berlin");
        assert_eq!(zone.tz(), chrono_tz::Europe::Berlin);
        assert_eq!(Zone::UTC.name(), "UTC");
        let s = Schedule::new("@daily", zone).unwrap();
        assert_eq!(s.expression(), "@daily");
        assert_eq!(s.zone(), zone);
    }
}
