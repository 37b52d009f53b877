//! One countdown episode: the puzzle, its prompt, the single step and the capability
//! impls.

use super::check::{check_answer, Verdict};
use super::puzzle::{generate, random_expr, solve, Puzzle, Rng};
use super::{Config, PromptStyle, NAME, POLICY_NAMES};
use crate::envs::rollout::HELD_OUT_BIT;
use crate::envs::{Environment, Inspect, Message, Reward, Scripted, StepOutcome};
use anyhow::bail;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The only seat, held by the policy.
pub const SEAT: usize = 0;

/// One puzzle, answered in one step.
#[derive(Debug, Clone)]
pub struct Countdown {
    cfg: Arc<Config>,
    seed: u64,
    puzzle: Puzzle,
    /// Left after generation; the `random` policy draws from it, so it is seeded too.
    rng: Rng,
    steps: Vec<Vec<String>>,
    verdict: Option<Verdict>,
}

impl Countdown {
    /// A held-out puzzle iff `seed` has [`HELD_OUT_BIT`], else a training one.
    pub fn new(cfg: Arc<Config>, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let puzzle = generate(&mut rng, &cfg, seed & HELD_OUT_BIT != 0);
        Self {
            cfg,
            seed,
            puzzle,
            rng,
            steps: Vec::new(),
            verdict: None,
        }
    }

    pub fn puzzle(&self) -> &Puzzle {
        &self.puzzle
    }

    /// What the checker said of the answer, once given.
    pub fn verdict(&self) -> Option<Verdict> {
        self.verdict
    }

    fn number_list(&self) -> String {
        let n: Vec<String> = self.puzzle.numbers.iter().map(u32::to_string).collect();
        format!("[{}]", n.join(", "))
    }

    fn system_prompt(&self) -> &'static str {
        match self.cfg.prompt {
            PromptStyle::Think => {
                "You are a helpful assistant. You first think about the reasoning process in \
                 the mind and then provide the user with the answer."
            }
            PromptStyle::Direct => {
                "You are a helpful assistant. You answer with the final equation only, \
                 without any explanation."
            }
        }
    }

    fn user_prompt(&self) -> String {
        let task = format!(
            "Using the numbers {}, create an equation that equals {}. You can use basic \
             arithmetic operations (+, -, *, /) and each number must be used exactly once.",
            self.number_list(),
            self.puzzle.target
        );
        match self.cfg.prompt {
            PromptStyle::Think => format!(
                "{task} Show your work in <think> </think> tags. And return the final answer \
                 in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
            ),
            PromptStyle::Direct => format!(
                "{task} Do not explain: reply with only the equation in <answer> </answer> \
                 tags, for example <answer> (1 + 2) / 3 </answer>."
            ),
        }
    }

    /// `equation` in the answer format of the prompt style (with a one-line
    /// `<think>` of `thought` under "think").
    fn answer_text(&self, thought: &str, equation: &str) -> String {
        match self.cfg.prompt {
            PromptStyle::Think => {
                format!("<think> {thought} </think>\n<answer> {equation} </answer>")
            }
            PromptStyle::Direct => format!("<answer> {equation} </answer>"),
        }
    }

    fn solver_text(&self) -> String {
        let p = &self.puzzle;
        match solve(&p.numbers, p.target) {
            Some(e) => self.answer_text(&format!("{e} = {}", p.target), &e.to_string()),
            // Unreachable for generated puzzles (each is built from a solution).
            None => self.sum_text(),
        }
    }

    fn sum_text(&self) -> String {
        let terms: Vec<String> = self.puzzle.numbers.iter().map(u32::to_string).collect();
        self.answer_text("Add all the numbers.", &terms.join(" + "))
    }

    fn random_text(&mut self) -> String {
        let e = random_expr(&mut self.rng, &self.puzzle.numbers);
        self.answer_text("Try a combination.", &e.to_string())
    }
}

/// One step: the answer. Its step reward is the scalar (1.0 correct, 0.1 well-formed
/// but wrong, 0.0 no parsable answer); `valid` is whether it parsed, and the feedback
/// says why not.
impl Environment for Countdown {
    fn name(&self) -> &'static str {
        NAME
    }
    fn num_seats(&self) -> usize {
        1
    }
    fn policy_seats(&self) -> Vec<usize> {
        vec![SEAT]
    }
    fn to_act(&self) -> Vec<usize> {
        if self.done() {
            Vec::new()
        } else {
            vec![SEAT]
        }
    }
    fn observation(&self, seat: usize) -> Vec<Message> {
        let user = if seat == SEAT {
            self.user_prompt()
        } else {
            format!("There is no seat {seat} in countdown; seat 0 answers.")
        };
        vec![Message::system(self.system_prompt()), Message::user(user)]
    }
    fn step(&mut self, actions: &[String]) -> anyhow::Result<StepOutcome> {
        if self.done() {
            bail!("the countdown episode is over");
        }
        let [text] = actions else {
            bail!("countdown step got {} actions for 1 seat", actions.len());
        };
        let v = check_answer(text, &self.puzzle.numbers, self.puzzle.target);
        self.steps.push(actions.to_vec());
        self.verdict = Some(v);
        let feedback = if v.format() {
            String::new()
        } else {
            format!(
                "no valid answer ({}): give one equation like <answer> (1 + 2) / 3 </answer>",
                v.reason()
            )
        };
        let mut out = StepOutcome::default();
        out.push(SEAT, v.scalar(), v.format(), feedback);
        Ok(out)
    }
    fn done(&self) -> bool {
        self.verdict.is_some()
    }
    fn reward(&self, seat: usize) -> Reward {
        let v = self.verdict.filter(|_| seat == SEAT);
        let bit = |b: bool| if b { 1.0 } else { 0.0 };
        let correct = bit(v.is_some_and(Verdict::correct));
        let components = BTreeMap::from([
            ("format".to_string(), bit(v.is_some_and(Verdict::format))),
            ("correct".to_string(), correct),
            ("win".to_string(), correct),
        ]);
        Reward {
            components,
            scalar: v.map_or(0.0, Verdict::scalar),
        }
    }
    fn transcript(&self) -> serde_json::Value {
        serde_json::json!({
            "env": NAME,
            "seed": self.seed,
            "config": &*self.cfg,
            "numbers": self.puzzle.numbers,
            "target": self.puzzle.target,
            "steps": self.steps,
            "verdict": self.verdict.map(Verdict::reason),
        })
    }
    fn clone_box(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
    fn as_scripted(&self) -> Option<&dyn Scripted> {
        Some(self)
    }
    fn as_scripted_mut(&mut self) -> Option<&mut dyn Scripted> {
        Some(self)
    }
    fn as_inspect(&self) -> Option<&dyn Inspect> {
        Some(self)
    }
}

/// The continuation policy is the `solver`.
impl Scripted for Countdown {
    fn continuation_action(&mut self, _seat: usize) -> String {
        self.solver_text()
    }
    fn policy_action(&mut self, policy: &str, seat: usize) -> anyhow::Result<String> {
        if seat != SEAT {
            bail!("countdown has no seat {seat}");
        }
        Ok(match policy {
            "solver" => self.solver_text(),
            "random" => self.random_text(),
            "sum" => self.sum_text(),
            _ => bail!(
                "unknown countdown policy `{policy}`; known: {}",
                POLICY_NAMES.join(", ")
            ),
        })
    }
}

impl Inspect for Countdown {
    fn won(&self, seat: usize) -> bool {
        seat == SEAT && self.verdict.is_some_and(Verdict::correct)
    }
    fn render_state(&self) -> String {
        let state = match self.verdict {
            None => "waiting for the answer".to_string(),
            Some(v) => format!("answer: {}", v.reason()),
        };
        format!(
            "numbers: {}  target: {}\n{state}",
            self.number_list(),
            self.puzzle.target
        )
    }
}
