//! Which live worker runs which binlog task (seed 001's self-balancing, by task count).
//!
//! Pure: the leader feeds it the live workers, the tasks and the current assignment, and
//! applies the moves it returns. Rules, in order:
//! 1. A task stays where it is while its worker lives.
//! 2. A task without a live worker (new, or its worker died) goes to the least-loaded
//!    worker with spare capacity.
//! 3. While the busiest eligible worker has more than `threshold` tasks above the idlest,
//!    one task moves from the first to the second. Workers that joined too recently to
//!    be trusted (the caller's `settled` flag) receive no moved tasks yet — against
//!    flapping when a worker restarts in a loop.
//!
//! Ties break by worker id and task name, so the same inputs give the same plan.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveWorker {
    pub id: String,
    pub capacity: usize,
    /// Live long enough to receive tasks moved off other workers.
    pub settled: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Move {
    pub task: String,
    /// `None` when the task had no live worker.
    pub from: Option<String>,
    pub to: String,
}

/// The moves that take `current` (task → worker, possibly dead) to a balanced
/// assignment of `tasks` over `workers`. A task that fits nowhere stays unassigned.
pub fn moves_for(
    workers: &[LiveWorker],
    tasks: &[String],
    current: &BTreeMap<String, String>,
    threshold: usize,
) -> Vec<Move> {
    let mut load: BTreeMap<&str, Vec<&str>> = workers
        .iter()
        .map(|w| (w.id.as_str(), Vec::new()))
        .collect();
    let capacity: BTreeMap<&str, usize> = workers
        .iter()
        .map(|w| (w.id.as_str(), w.capacity))
        .collect();
    let mut orphans = Vec::new();
    let mut tasks: Vec<&String> = tasks.iter().collect();
    tasks.sort();
    tasks.dedup();
    for task in tasks {
        match current
            .get(task.as_str())
            .and_then(|w| load.get_mut(w.as_str()))
        {
            Some(on) => on.push(task),
            None => orphans.push(task),
        }
    }
    let mut moves = place_orphans(&mut load, &capacity, orphans, current);
    let settled: BTreeMap<&str, bool> =
        workers.iter().map(|w| (w.id.as_str(), w.settled)).collect();
    even_out(&mut load, &capacity, &settled, threshold, &mut moves);
    moves.retain(|m| m.from.as_deref() != Some(m.to.as_str()));
    moves.sort();
    moves
}

/// Places each task without a live worker on the least loaded one with room.
fn place_orphans<'a>(
    load: &mut BTreeMap<&'a str, Vec<&'a str>>,
    capacity: &BTreeMap<&str, usize>,
    orphans: Vec<&'a String>,
    current: &BTreeMap<String, String>,
) -> Vec<Move> {
    let mut moves = Vec::new();
    for task in orphans {
        let to = load
            .iter()
            .filter(|(w, ts)| ts.len() < capacity[*w])
            .min_by_key(|(w, ts)| (ts.len(), **w))
            .map(|(w, _)| *w);
        if let Some(to) = to {
            load.get_mut(to).expect("worker").push(task);
            moves.push(Move {
                task: task.clone(),
                from: current.get(task.as_str()).cloned(),
                to: to.to_owned(),
            });
        }
    }
    moves
}

/// Moves tasks from the busiest worker to the idlest settled one with room until they
/// differ by at most `threshold`; a task moved twice in one plan is one move.
fn even_out(
    load: &mut BTreeMap<&str, Vec<&str>>,
    capacity: &BTreeMap<&str, usize>,
    settled: &BTreeMap<&str, bool>,
    threshold: usize,
    moves: &mut Vec<Move>,
) {
    while let Some((busiest, most)) = load
        .iter()
        .max_by_key(|(w, ts)| (ts.len(), std::cmp::Reverse(**w)))
        .map(|(w, ts)| (*w, ts.len()))
    {
        let Some((idlest, least)) = load
            .iter()
            .filter(|(w, ts)| settled[*w] && ts.len() < capacity[*w])
            .min_by_key(|(w, ts)| (ts.len(), **w))
            .map(|(w, ts)| (*w, ts.len()))
        else {
            break;
        };
        if most <= least + threshold {
            break;
        }
        let task = load
            .get_mut(busiest)
            .expect("worker")
            .pop()
            .expect("the busiest worker has tasks");
        load.get_mut(idlest).expect("worker").push(task);
        // A task moved twice in one plan (orphan placed, then rebalanced) is one move.
        match moves.iter_mut().find(|m| m.task == task) {
            Some(m) => m.to = idlest.to_owned(),
            None => moves.push(Move {
                task: task.to_owned(),
                from: Some(busiest.to_owned()),
                to: idlest.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(ids: &[&str]) -> Vec<LiveWorker> {
        ids.iter()
            .map(|id| LiveWorker {
                id: (*id).into(),
                capacity: 100,
                settled: true,
            })
            .collect()
    }

    fn tasks(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t{i}")).collect()
    }

    fn apply(current: &mut BTreeMap<String, String>, moves: &[Move]) {
        for m in moves {
            current.insert(m.task.clone(), m.to.clone());
        }
    }

    fn counts(current: &BTreeMap<String, String>) -> BTreeMap<String, usize> {
        let mut c = BTreeMap::new();
        for w in current.values() {
            *c.entry(w.clone()).or_default() += 1;
        }
        c
    }

    #[test]
    fn new_tasks_spread_evenly_and_a_second_plan_moves_nothing() {
        let ws = workers(&["a", "b", "c"]);
        let mut current = BTreeMap::new();
        let moves = moves_for(&ws, &tasks(7), &current, 1);
        assert_eq!(moves.len(), 7);
        assert!(moves.iter().all(|m| m.from.is_none()));
        apply(&mut current, &moves);
        let c = counts(&current);
        assert_eq!(c.values().max().unwrap() - c.values().min().unwrap(), 1);
        assert!(moves_for(&ws, &tasks(7), &current, 1).is_empty());
    }

    #[test]
    fn a_dead_workers_tasks_move_and_others_stay() {
        let mut current = BTreeMap::new();
        let moves = moves_for(&workers(&["a", "b", "c"]), &tasks(6), &current, 1);
        apply(&mut current, &moves);
        let before = current.clone();
        let moves = moves_for(&workers(&["a", "c"]), &tasks(6), &current, 1);
        assert_eq!(moves.len(), 2, "{moves:?}");
        assert!(moves.iter().all(|m| m.from.as_deref() == Some("b")));
        apply(&mut current, &moves);
        for (t, w) in &before {
            if w != "b" {
                assert_eq!(&current[t], w, "{t} moved off a live worker");
            }
        }
        assert_eq!(
            counts(&current),
            BTreeMap::from([("a".into(), 3), ("c".into(), 3)])
        );
    }

    #[test]
    fn a_joining_worker_gets_tasks_once_settled_and_beyond_the_threshold() {
        let mut current = BTreeMap::new();
        let moves = moves_for(&workers(&["a", "b"]), &tasks(6), &current, 1);
        apply(&mut current, &moves);
        let mut ws = workers(&["a", "b", "c"]);
        ws[2].settled = false;
        assert!(
            moves_for(&ws, &tasks(6), &current, 1).is_empty(),
            "moved to an unsettled worker"
        );
        ws[2].settled = true;
        let moves = moves_for(&ws, &tasks(6), &current, 1);
        assert_eq!(moves.len(), 2);
        assert!(moves.iter().all(|m| m.to == "c"));
        // A threshold of 3 tolerates 3 against 0.
        assert!(moves_for(&ws, &tasks(6), &current, 3).is_empty());
    }

    #[test]
    fn capacity_is_respected_and_what_fits_nowhere_waits() {
        let mut ws = workers(&["a", "b"]);
        ws[0].capacity = 1;
        ws[1].capacity = 1;
        let moves = moves_for(&ws, &tasks(3), &BTreeMap::new(), 1);
        assert_eq!(moves.len(), 2);
        assert!(moves_for(&[], &tasks(3), &BTreeMap::new(), 1).is_empty());
    }

    #[test]
    fn removed_tasks_are_not_planned() {
        let mut current = BTreeMap::new();
        let moves = moves_for(&workers(&["a"]), &tasks(2), &current, 1);
        apply(&mut current, &moves);
        let moves = moves_for(&workers(&["a", "b"]), &tasks(1), &current, 1);
        assert!(moves.is_empty(), "{moves:?}");
    }
}
