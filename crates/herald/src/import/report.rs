//! What an import tells its operator: a progress bar per kind on a terminal (stderr), the
//! plan of a dry run, every failure with its reason, what needs a hand, and a summary
//! (stdout).

use std::sync::Mutex;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    EventType,
    Application,
    Endpoint,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::EventType, Kind::Application, Kind::Endpoint];

    fn plural(self) -> &'static str {
        match self {
            Self::EventType => "event types",
            Self::Application => "applications",
            Self::Endpoint => "endpoints",
        }
    }
}

/// What became of one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Created,
    /// These fields changed (`secret` and `headers` among them).
    Updated(Vec<String>),
    Unchanged,
    /// It did not come over, and why.
    Failed(String),
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub created: usize,
    pub updated: usize,
    pub unchanged: usize,
    pub failed: usize,
}

impl Tally {
    fn add(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Created => self.created += 1,
            Outcome::Updated(_) => self.updated += 1,
            Outcome::Unchanged => self.unchanged += 1,
            Outcome::Failed(_) => self.failed += 1,
        }
    }
}

pub struct Report {
    dry_run: bool,
    bars: MultiProgress,
    kinds: [(ProgressBar, Mutex<Tally>); 3],
    failures: Mutex<Vec<String>>,
    gaps: Mutex<Vec<String>>,
}

impl Report {
    pub fn new(dry_run: bool) -> Self {
        let bars = MultiProgress::new();
        let style = ProgressStyle::with_template("{prefix:>13} [{bar:30}] {pos}/{len} {msg}")
            .expect("the template is valid")
            .progress_chars("=> ");
        let kinds = Kind::ALL.map(|kind| {
            let bar = bars.add(ProgressBar::new(0).with_style(style.clone()).with_prefix(kind.plural()));
            (bar, Mutex::new(Tally::default()))
        });
        Self { dry_run, bars, kinds, failures: Mutex::default(), gaps: Mutex::default() }
    }

    fn of(&self, kind: Kind) -> &(ProgressBar, Mutex<Tally>) {
        &self.kinds[kind as usize]
    }

    /// `count` more objects of `kind` are to be imported.
    pub fn expect(&self, kind: Kind, count: usize) {
        self.of(kind).0.inc_length(count as u64);
    }

    /// A line above the bars (or on stdout, when they are not drawn).
    fn say(&self, line: &str) {
        if self.bars.is_hidden() {
            println!("{line}");
        } else {
            let _ = self.bars.println(line);
        }
    }

    pub fn record(&self, kind: Kind, what: &str, outcome: Outcome) {
        let (bar, tally) = self.of(kind);
        let mut tally = tally.lock().expect("not poisoned");
        tally.add(&outcome);
        bar.set_message(format!(
            "{} {} · {} {} · {} unchanged · {} failed",
            tally.created,
            self.verb("created"),
            tally.updated,
            self.verb("updated"),
            tally.unchanged,
            tally.failed
        ));
        bar.inc(1);
        drop(tally);
        match outcome {
            Outcome::Created if self.dry_run => self.say(&format!("create {what}")),
            Outcome::Updated(fields) if self.dry_run => self.say(&format!("update {what}: {}", fields.join(", "))),
            Outcome::Failed(reason) => {
                self.say(&format!("failed: {what}: {reason}"));
                self.failures.lock().expect("not poisoned").push(format!("{what}: {reason}"));
            }
            _ => {}
        }
    }

    /// Something about `what` the import could not carry over and the operator must set by
    /// hand.
    pub fn gap(&self, what: &str, text: &str) {
        self.gaps.lock().expect("not poisoned").push(format!("{what}: {text}"));
    }

    fn verb(&self, done: &'static str) -> &'static str {
        match (self.dry_run, done) {
            (true, "created") => "to create",
            (true, _) => "to update",
            (false, done) => done,
        }
    }

    /// Ends the bars and renders the summary; whether everything came over.
    pub fn finish(self) -> (String, bool) {
        for (bar, _) in &self.kinds {
            bar.finish();
        }
        let tallies = self.kinds.map(|(_, tally)| tally.into_inner().expect("not poisoned"));
        let failures = self.failures.into_inner().expect("not poisoned");
        let gaps = self.gaps.into_inner().expect("not poisoned");
        let head = if self.dry_run { ("to create", "to update") } else { ("created", "updated") };
        let mut lines = vec![format!("{:<13} {:>9} {:>9} {:>9} {:>6}", "", head.0, head.1, "unchanged", "failed")];
        for (kind, t) in Kind::ALL.iter().zip(&tallies) {
            lines.push(format!(
                "{:<13} {:>9} {:>9} {:>9} {:>6}",
                kind.plural(),
                t.created,
                t.updated,
                t.unchanged,
                t.failed
            ));
        }
        for (title, items) in [("Failed", &failures), ("To set by hand", &gaps)] {
            if !items.is_empty() {
                lines.push(format!("\n{title} ({}):", items.len()));
                lines.extend(items.iter().map(|item| format!("  {item}")));
            }
        }
        let complete = failures.is_empty() && gaps.is_empty();
        lines.push(match (self.dry_run, complete) {
            (true, _) => "\nDry run: nothing was written.".to_owned(),
            (false, true) => "\nEverything came over.".to_owned(),
            (false, false) => format!(
                "\nNot everything came over: {} failed, {} to set by hand. Running the import again retries what failed.",
                failures.len(),
                gaps.len()
            ),
        });
        let out = lines.join("\n") + "\n";
        (out, complete)
    }
}
