//! `rendezvous`: two friends must meet at one of four places. The partner (scripted)
//! has said where it is going; the policy seat reads the message and picks a place.
//! Meeting is worth 1, missing 0. A skeptic's baselines: always the first place (the
//! best constant policy) meets a quarter of the time; following the message, always.
//!
//! The environment contract (`concord::envs`): text in, text out, seeded, never
//! panics on any text, clone and replay. Scripted policies, a win rule and `concord
//! envs` tools are optional capabilities; this file shows each.
use anyhow::{bail, Result};
use concord::envs::{
    wilson_ci, BaselineRow, EnvEntry, EnvFactory, Environment, Inspect, Message, Options, Reward,
    Scripted, StepOutcome, Tools,
};
use std::collections::BTreeMap;

pub const NAME: &str = "rendezvous";
const PLACES: [&str; 4] = ["cafe", "library", "station", "park"];

/// The registry row `concord::cli::main_with` takes.
pub fn entry() -> EnvEntry {
    EnvEntry {
        name: NAME,
        summary: "meet your partner at the place it said it would go",
        create: Some(factory),
        path_options: &[],
    }
}

/// `[env.options]`: `places` (2 to 4, default 4).
fn factory(options: &Options) -> Result<Box<dyn EnvFactory>> {
    let mut places = PLACES.len();
    for (k, v) in options {
        match (k.as_str(), v.as_integer()) {
            ("places", Some(n)) if (2..=PLACES.len() as i64).contains(&n) => places = n as usize,
            ("places", _) => bail!("rendezvous option `places` must be 2 to 4, got {v}"),
            _ => bail!("unknown rendezvous option `{k}` (known: places)"),
        }
    }
    Ok(Box::new(Factory { places }))
}

struct Factory {
    places: usize,
}

impl EnvFactory for Factory {
    fn name(&self) -> &'static str {
        NAME
    }
    fn reset(&self, seed: u64) -> Box<dyn Environment> {
        Box::new(Episode {
            seed,
            places: self.places,
            // a pure function of the seed (a splitmix64 step)
            target: (mix(seed) % self.places as u64) as usize,
            choice: None,
            steps: Vec::new(),
        })
    }
    fn tools(&self) -> Option<&dyn Tools> {
        Some(self)
    }
}

fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Clone)]
struct Episode {
    seed: u64,
    places: usize,
    /// Where the partner goes (and said it would).
    target: usize,
    /// The place the policy seat picked, once it has.
    choice: Option<usize>,
    steps: Vec<Vec<String>>,
}

impl Episode {
    /// The first place named in `text`; `None` when it names none (the default, the
    /// first place, is then played).
    fn parse(&self, text: &str) -> Option<usize> {
        let lower = text.to_lowercase();
        PLACES[..self.places]
            .iter()
            .enumerate()
            .filter_map(|(i, p)| lower.find(p).map(|at| (at, i)))
            .min()
            .map(|(_, i)| i)
    }
}

impl Environment for Episode {
    fn name(&self) -> &'static str {
        NAME
    }
    fn num_seats(&self) -> usize {
        2
    }
    fn policy_seats(&self) -> Vec<usize> {
        vec![0]
    }
    fn to_act(&self) -> Vec<usize> {
        if self.choice.is_none() {
            vec![0]
        } else {
            Vec::new()
        }
    }
    fn observation(&self, _seat: usize) -> Vec<Message> {
        let places = PLACES[..self.places].join(", ");
        vec![
            Message::system(format!(
                "You are meeting a friend at one of these places: {places}. Answer with \
                 the place's name only."
            )),
            Message::user(format!(
                "Your friend texted: \"See you at the {} in ten minutes!\" Where do you go?",
                PLACES[self.target]
            )),
        ]
    }
    fn step(&mut self, actions: &[String]) -> Result<StepOutcome> {
        let mut out = StepOutcome::default();
        if self.choice.is_some() {
            return Ok(out);
        }
        anyhow::ensure!(
            actions.len() == 1,
            "rendezvous: one answer per step, got {}",
            actions.len()
        );
        let parsed = self.parse(&actions[0]);
        let choice = parsed.unwrap_or(0);
        self.choice = Some(choice);
        self.steps.push(actions.to_vec());
        let feedback = match parsed {
            Some(_) => String::new(),
            None => format!("no place named; went to the {}", PLACES[0]),
        };
        out.push(0, self.reward(0).scalar, parsed.is_some(), feedback);
        Ok(out)
    }
    fn done(&self) -> bool {
        self.choice.is_some()
    }
    fn reward(&self, _seat: usize) -> Reward {
        let met = f64::from(u8::from(self.choice == Some(self.target)));
        Reward {
            components: BTreeMap::from([("win".to_string(), met)]),
            scalar: met,
        }
    }
    fn transcript(&self) -> serde_json::Value {
        serde_json::json!({ "seed": self.seed, "steps": self.steps, "target": PLACES[self.target] })
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

impl Scripted for Episode {
    /// The heuristic: go where the friend said.
    fn continuation_action(&mut self, _seat: usize) -> String {
        PLACES[self.target].to_string()
    }
    fn policy_action(&mut self, policy: &str, seat: usize) -> Result<String> {
        match policy {
            "follow" => Ok(self.continuation_action(seat)),
            "first" => Ok(PLACES[0].to_string()),
            _ => bail!("unknown rendezvous policy `{policy}`; known: follow, first"),
        }
    }
    fn answer_texts(&self, _seat: usize) -> Vec<String> {
        PLACES[..self.places]
            .iter()
            .map(|p| p.to_string())
            .collect()
    }
}

/// The default win rule (a `win` component of at least 0.5); a state view for `envs play`.
impl Inspect for Episode {
    fn render_state(&self) -> String {
        format!("the friend goes to the {}", PLACES[self.target])
    }
}

impl Tools for Factory {
    fn describe(&self) -> String {
        format!(
            "rendezvous: meet a friend at one of {} places ({}). The friend's text names \
             where it goes; answer with a place's name. Reward (and `win`): 1 when you \
             meet, else 0. A text naming no place goes to the {}.\n\
             options: places (2-4)\npolicies: follow (the text's place), first (always the \
             first place)\npools: default\n",
            self.places,
            PLACES[..self.places].join(", "),
            PLACES[0]
        )
    }
    fn policies(&self) -> Vec<&'static str> {
        vec!["follow", "first"]
    }
    fn pools(&self) -> Vec<&'static str> {
        vec!["default"]
    }
    fn baseline(
        &self,
        policy: &str,
        pool: &str,
        episodes: usize,
        first_seed: u64,
    ) -> Result<BaselineRow> {
        if pool != "default" {
            bail!("unknown rendezvous pool `{pool}`; known: default");
        }
        let mut wins = 0;
        for i in 0..episodes as u64 {
            let mut env = self.reset(first_seed + i);
            let text = env.policy_action(policy, 0)?;
            env.step(&[text])?;
            wins += usize::from(env.won(0));
        }
        let n = episodes.max(1) as f64;
        Ok(BaselineRow {
            policy: policy.to_string(),
            peers: pool.to_string(),
            level: None,
            episodes,
            win_rate: wins as f64 / n,
            win_ci: wilson_ci(wins, episodes),
            mean_reward: wins as f64 / n,
            extra: BTreeMap::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn following_the_text_always_meets_and_a_constant_meets_a_quarter() {
        let f = factory(&Options::new()).unwrap();
        let follow = f.baseline("follow", "default", 400, 0).unwrap();
        assert_eq!(follow.win_rate, 1.0);
        let first = f.baseline("first", "default", 400, 0).unwrap();
        assert!((first.win_rate - 0.25).abs() < 0.06, "{}", first.win_rate);
    }

    #[test]
    fn any_text_parses_to_a_place_or_the_default() {
        let f = factory(&Options::new()).unwrap();
        let mut env = f.reset(3);
        let out = env.step(&["\u{0}}{ no idea".to_string()]).unwrap();
        assert_eq!(out.valid, [false]);
        assert!(env.done());
        let mut env = f.reset(3);
        env.step(&["The PARK, then the cafe".to_string()]).unwrap();
        assert_eq!(env.transcript()["steps"][0][0], "The PARK, then the cafe");
        assert!(factory(&toml::from_str("places = 9").unwrap()).is_err());
    }
}
