//! The progress of a long operation (a build, a check, a compare, a delayed job) on
//! stderr: a bar drawn by indicatif when stderr is a terminal; otherwise one plain line
//! each time the operation enters another stage, and its last state at the end, so that a
//! log or a CI job's output stays readable (no carriage returns, no redrawn lines).

use std::io::{IsTerminal as _, Write};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Where an operation stands: `done` of `total` units, the stage it is in (a build's
/// phase, a check's state) and what else to say.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub done: u64,
    pub total: u64,
    pub stage: String,
    pub detail: String,
}

pub struct Progress {
    label: String,
    draw: Draw,
    last: Option<Step>,
    printed: Option<Step>,
}

enum Draw {
    Bar(ProgressBar),
    Lines(Box<dyn Write + Send>),
}

impl Progress {
    /// Progress of `label` (e.g. `products v3`) on stderr.
    pub fn stderr(label: impl Into<String>) -> Progress {
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {percent:>3}% {msg}")
                    .expect("a valid template")
                    .progress_chars("#>."),
            );
            let label = label.into();
            bar.set_prefix(label.clone());
            Progress {
                label,
                draw: Draw::Bar(bar),
                last: None,
                printed: None,
            }
        } else {
            Progress::lines(label, Box::new(std::io::stderr()))
        }
    }

    /// Progress as plain lines into `out`: what a run prints when stderr is no terminal.
    pub fn lines(label: impl Into<String>, out: Box<dyn Write + Send>) -> Progress {
        Progress {
            label: label.into(),
            draw: Draw::Lines(out),
            last: None,
            printed: None,
        }
    }

    pub fn show(&mut self, step: Step) {
        match &mut self.draw {
            Draw::Bar(bar) => {
                bar.set_length(step.total.max(step.done).max(1));
                bar.set_position(step.done);
                bar.set_message(format!("{} {}", step.detail, step.stage));
            }
            Draw::Lines(out) => {
                if self.last.as_ref().map(|l| &l.stage) != Some(&step.stage) {
                    let _ = writeln!(out, "{}", line(&self.label, &step));
                    let _ = out.flush();
                    self.printed = Some(step.clone());
                }
            }
        }
        self.last = Some(step);
    }

    /// The operation ended: the bar stays as it is; plain output gets the last state
    /// unless it was the last line printed.
    pub fn finish(self) {
        match self.draw {
            Draw::Bar(bar) => bar.finish(),
            Draw::Lines(mut out) => {
                // A stage's line says how it started; the end says how it ended.
                if let Some(step) = self.last.filter(|l| self.printed.as_ref() != Some(l)) {
                    let _ = writeln!(out, "{}", line(&self.label, &step));
                    let _ = out.flush();
                }
            }
        }
    }
}

fn line(label: &str, step: &Step) -> String {
    let share = step.done as f64 / step.total.max(step.done).max(1) as f64;
    format!(
        "{label}: {} {:.0}% {}",
        step.stage,
        share * 100.0,
        step.detail
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn step(done: u64, stage: &str) -> Step {
        Step {
            done,
            total: 200,
            stage: stage.into(),
            detail: format!("{done}/200 rows"),
        }
    }

    fn printed(steps: Vec<Step>) -> Vec<String> {
        let out = Captured::default();
        let mut p = Progress::lines("products v3", Box::new(out.clone()));
        for s in steps {
            p.show(s);
        }
        p.finish();
        let printed = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(!printed.contains('\r'), "no redrawn lines: {printed:?}");
        printed.lines().map(str::to_owned).collect()
    }

    #[test]
    fn without_a_terminal_each_stage_is_one_line() {
        let lines = printed(vec![
            step(0, "planning"),
            step(0, "snapshotting"),
            step(50, "snapshotting"),
            step(150, "snapshotting"),
            step(200, "catching up"),
            step(200, "catching up"),
            step(200, "done"),
        ]);
        assert_eq!(
            lines,
            [
                "products v3: planning 0% 0/200 rows",
                "products v3: snapshotting 0% 0/200 rows",
                "products v3: catching up 100% 200/200 rows",
                "products v3: done 100% 200/200 rows",
            ]
        );
    }

    #[test]
    fn without_a_terminal_the_end_says_where_it_stopped() {
        let lines = printed(vec![
            step(0, "running"),
            step(50, "running"),
            step(150, "running"),
        ]);
        assert_eq!(
            lines,
            [
                "products v3: running 0% 0/200 rows",
                "products v3: running 75% 150/200 rows",
            ]
        );
        assert!(printed(vec![]).is_empty());
    }
}
