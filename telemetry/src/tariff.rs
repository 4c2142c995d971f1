//! Time-of-use tariffs, from the site file: a price per kWh by local clock time and
//! weekday in the site's time zone (so a DST change moves nothing on the local clock),
//! and a demand charge per kW of the billing period's peak.

use chrono::{Datelike, Timelike};
use chrono_tz::Tz;
use serde::Serialize;

use crate::Timestamp;

/// One period of the day at one price. `from` may be later than `to` (over midnight).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TouPeriod {
    pub name: String,
    /// Monday first.
    pub days: [bool; 7],
    /// Minutes after local midnight; `to` is exclusive (1440: midnight).
    pub from_min: u32,
    pub to_min: u32,
    pub per_kwh: f64,
}

impl TouPeriod {
    fn covers(&self, weekday: usize, minute: u32) -> bool {
        if self.from_min < self.to_min {
            self.days[weekday] && (self.from_min..self.to_min).contains(&minute)
        } else if minute >= self.from_min {
            self.days[weekday]
        } else {
            // after midnight: the period started the day before
            self.days[(weekday + 6) % 7] && minute < self.to_min
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tariff {
    /// The price outside every period.
    pub default_per_kwh: f64,
    /// The first period that covers an instant sets its price.
    pub periods: Vec<TouPeriod>,
    /// Cost per kW of the billing period's peak demand.
    pub demand_charge_per_kw: Option<f64>,
    /// The interval the utility averages demand over (e.g. 15 minutes), in seconds;
    /// `None`: the energy ledger's interval.
    pub demand_interval_s: Option<f64>,
}

impl Tariff {
    /// The price in force at `t`, and the name of the period (`default` outside them).
    pub fn at(&self, t: Timestamp, tz: Tz) -> (f64, &str) {
        let local = t.to_datetime().with_timezone(&tz);
        let weekday = local.weekday().num_days_from_monday() as usize;
        let minute = local.hour() * 60 + local.minute();
        self.periods
            .iter()
            .find(|p| p.covers(weekday, minute))
            .map_or((self.default_per_kwh, "default"), |p| {
                (p.per_kwh, p.name.as_str())
            })
    }
}

/// `HH:MM` as minutes after midnight (`24:00` allowed as an end).
pub fn parse_clock(s: &str) -> Option<u32> {
    let (h, m) = s.split_once(':')?;
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (m < 60 && (h < 24 || (h == 24 && m == 0)) && h < 25).then_some(h * 60 + m)
}

/// `mon`..`sun` as an index, Monday first.
pub fn parse_day(s: &str) -> Option<usize> {
    ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
        .iter()
        .position(|d| s.eq_ignore_ascii_case(d))
}

#[cfg(test)]
mod tests {
    use crate::{Site, Timestamp};

    const BASE: &str = "version = 1\n[site]\nname = \"t\"\ntimezone = \"Europe/Berlin\"\n[[feeds]]\nid = \"f\"\nrating_kw = 30\n[[cooling]]\nid = \"c\"\ncapacity_kw = 30\nracks = [\"r1\"]\n[[rooms]]\nid = \"h\"\n[[rows]]\nid = \"w\"\nroom = \"h\"\n[[racks]]\nid = \"r1\"\nrow = \"w\"\npower_budget_kw = 10\nnodes = 1\ngpus_per_node = 1\ngpu_model = \"A40\"\n";

    const TARIFF: &str = "[tariff]\ndefault_per_kwh = 0.20\ndemand_charge_per_kw = 12.5\ndemand_interval_min = 15\n[[tariff.periods]]\nname = \"peak\"\ndays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\"]\nfrom = \"08:00\"\nto = \"20:00\"\nper_kwh = 0.30\n[[tariff.periods]]\nname = \"night\"\nfrom = \"22:00\"\nto = \"06:00\"\nper_kwh = 0.12\n";

    fn t(s: &str) -> Timestamp {
        Timestamp::parse_rfc3339(s).expect("time")
    }

    #[test]
    fn periods_follow_the_local_clock_across_dst_and_midnight() {
        let site = Site::parse("t.toml", &format!("{BASE}{TARIFF}")).expect("site");
        let tariff = site.tariff.clone().expect("tariff");
        let at = |s: &str| tariff.at(t(s), site.timezone);
        // Friday 2024-10-25 08:00 CEST = 06:00Z; Monday 2024-10-28 08:00 CET = 07:00Z
        assert_eq!(at("2024-10-25T06:00:00Z"), (0.30, "peak"));
        assert_eq!(
            at("2024-10-28T06:30:00Z"),
            (0.20, "default"),
            "07:30 local in winter"
        );
        assert_eq!(at("2024-10-28T07:00:00Z"), (0.30, "peak"));
        // Saturday: no peak; 23:30 local and 05:30 local are night, over midnight
        assert_eq!(at("2024-10-26T10:00:00Z"), (0.20, "default"));
        assert_eq!(at("2024-10-26T21:30:00Z"), (0.12, "night"));
        // the repeated 02:30 of 2024-10-27 is night both times
        assert_eq!(at("2024-10-27T00:30:00Z"), (0.12, "night"));
        assert_eq!(at("2024-10-27T01:30:00Z"), (0.12, "night"));
        assert_eq!(at("2024-10-27T05:30:00Z"), (0.20, "default"), "06:30 CET");
        assert_eq!(tariff.demand_charge_per_kw, Some(12.5));
        assert_eq!(tariff.demand_interval_s, Some(900.0));
    }

    #[test]
    fn broken_tariffs_say_where() {
        let bad = "[tariff]\ndefault_per_kwh = 1e9\ndemand_interval_min = 7\n[[tariff.periods]]\nname = \"x\"\ndays = [\"funday\"]\nfrom = \"25:00\"\nto = \"25:00\"\nper_kwh = 0.1\n";
        let e = Site::parse("t.toml", &format!("{BASE}{bad}"))
            .expect_err("invalid")
            .to_string();
        for needle in [
            "default_per_kwh must be within",
            "unknown day \"funday\"",
            "is not a time of day",
            "demand_interval_min must divide a day",
        ] {
            assert!(e.contains(needle), "{needle} in {e}");
        }
        assert!(e.contains("t.toml:"), "{e}");
    }
}
