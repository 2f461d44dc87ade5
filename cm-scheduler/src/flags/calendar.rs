//! The `calendar` commands' flags: holiday calendars routines share (create, add-dates,
//! remove-dates, show, list, delete), and the flags that put a routine on one.

use std::path::PathBuf;

use clap::{Args, Subcommand};

/// `calendar`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum CalendarCommand {
    /// Creates a holiday calendar: its days off are its dates plus its weekly days off.
    Create {
        /// Its name: letters, digits, '-', '_' and '.', at most 63.
        name: String,
        /// The IANA zone its days are read in.
        #[arg(long)]
        timezone: String,
        /// A date off (YYYY-MM-DD); repeat it for more.
        #[command(flatten)]
        dates: DateFlags,
        /// Its weekly days off: day names (sat,sun), or none.
        #[arg(long, default_value = "sat,sun", value_name = "DAYS")]
        days_off: String,
    },
    /// Adds dates off to a calendar, and plans the routines on it again.
    AddDates {
        /// The calendar's name.
        name: String,
        /// The dates.
        #[command(flatten)]
        dates: DateFlags,
    },
    /// Takes dates off a calendar, and plans the routines on it again.
    RemoveDates {
        /// The calendar's name.
        name: String,
        /// The dates.
        #[command(flatten)]
        dates: DateFlags,
    },
    /// Shows a calendar: its zone, weekly days off, how many routines are on it and its dates.
    Show {
        /// The calendar's name.
        name: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Lists the calendars.
    List {
        /// As JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Deletes a calendar; refused while a routine is on it.
    Delete {
        /// The calendar's name.
        name: String,
    },
}

/// Dates given on the command line or in a file.
#[derive(Debug, Clone, Default, Args)]
pub struct DateFlags {
    /// A date (YYYY-MM-DD); repeat it for more.
    #[arg(long = "date", value_name = "YYYY-MM-DD")]
    pub dates: Vec<String>,
    /// A file of dates, one a line (YYYY-MM-DD, then anything, such as the holiday's name;
    /// blank lines and lines starting with # are skipped).
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
}

/// A routine's calendar, as `routine create` and `routine update` take it.
#[derive(Debug, Clone, Default, Args, PartialEq, Eq)]
pub struct CalendarFlags {
    /// The holiday calendar it runs on (`calendar create`); with `routine update`, `none`
    /// takes it off its calendar.
    #[arg(long, value_name = "NAME")]
    pub calendar: Option<String>,
    /// What an occurrence on a day off of its calendar does: skip (not owed; the default),
    /// next or previous (owed at the same time of day on the next or previous business day).
    #[arg(long, value_name = "POLICY", value_parser = ["skip", "next", "previous"])]
    pub on_holiday: Option<String>,
}
