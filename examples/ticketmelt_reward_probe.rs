//! What a single-decision TICKETMELT reward teaches, per continuation policy.
//!
//!     cargo run --release --example ticketmelt_reward_probe
//!
//! GRPO's single-decision task scores one move of the trained seat, then lets the
//! environment's `continuation` policy play the seat to the end (`reward = "weighted"`,
//! the default preset). For each continuation this prints:
//! * the mean reward of each move (A, B, MONITOR) over 4,000 training decisions, and how
//!   often each is the unique best: the move a policy that cannot tell states apart
//!   drifts to;
//! * the held-out win rate (binary rule) of the policy that plays the best move of that
//!   reward at every step of 400 episodes. That policy is clairvoyant: it scores each
//!   move on a copy of the episode, whose future holds the same random draws (the
//!   peers' hidden types, fix times, tie breaks) as the episode it then plays. It is an
//!   upper bound that no policy reading the state reaches, not a target.
use concord::envs::{self, EnvFactory};

const MOVES: [&str; 3] = ["DEPLOY_PROD_A", "DEPLOY_PROD_B", "MONITOR"];

fn answer(m: &str) -> String {
    format!("{{\"commitment\": \"{m}\", \"channel_msg\": \"\"}}")
}

fn factory(continuation: Option<&str>) -> anyhow::Result<Box<dyn EnvFactory>> {
    let mut o = envs::Options::new();
    o.insert("preset".into(), "default".into());
    if let Some(c) = continuation {
        o.insert("reward".into(), "weighted".into());
        o.insert("continuation".into(), c.into());
    }
    envs::create("ticketmelt", &o)
}

/// Index of the best move (MONITOR on ties) and whether it is the unique best.
fn best(q: &[f64; 3]) -> (usize, bool) {
    let mx = q.iter().cloned().fold(f64::MIN, f64::max);
    let at: Vec<usize> = (0..3).filter(|&k| q[k] > mx - 1e-9).collect();
    (*at.last().unwrap_or(&2), at.len() == 1)
}

fn main() -> anyhow::Result<()> {
    let judge = factory(None)?;
    println!("| continuation | mean reward A / B / MONITOR | unique best A / B / MONITOR / tie | greedy win (400 held-out) |");
    println!("| --- | --- | --- | ---: |");
    for c in [
        "heuristic",
        "alternator",
        "random",
        "nervous",
        "eager",
        "always_a",
        "always_b",
        "always_monitor",
    ] {
        let f = factory(Some(c))?;
        let (mut sum, mut uniq, n) = ([0.0; 3], [0usize; 4], 4000u64);
        for i in 0..n {
            let d = envs::sample_decision(f.as_ref(), envs::training_seed(i * 7919 + 1));
            let mut q = [0.0; 3];
            for (k, m) in MOVES.iter().enumerate() {
                q[k] = envs::score_decision(&d, &answer(m)).scalar;
                sum[k] += q[k];
            }
            match best(&q) {
                (k, true) => uniq[k] += 1,
                (_, false) => uniq[3] += 1,
            }
        }
        let episodes = 400u64;
        let mut wins = 0.0;
        for i in 0..episodes {
            let seed = envs::eval_seed(i);
            let (mut env, mut judged) = (f.reset(seed), judge.reset(seed));
            while !env.done() {
                let texts: Vec<String> = env
                    .to_act()
                    .into_iter()
                    .map(|s| {
                        if !env.policy_seats().contains(&s) {
                            return env.continuation_action(s);
                        }
                        let mut q = [0.0; 3];
                        for (k, m) in MOVES.iter().enumerate() {
                            let r = envs::score_joint(env.as_ref(), &[(s, &answer(m))]);
                            q[k] = r.first().map_or(0.0, |r| r.scalar);
                        }
                        answer(MOVES[best(&q).0])
                    })
                    .collect();
                env.step(&texts)?;
                judged.step(&texts)?;
            }
            wins += judged
                .reward(0)
                .components
                .get("win")
                .copied()
                .unwrap_or(0.0);
        }
        let m = |k: usize| sum[k] / n as f64;
        println!(
            "| {c} | {:.3} / {:.3} / {:.3} | {} / {} / {} / {} | {:.3} |",
            m(0),
            m(1),
            m(2),
            uniq[0],
            uniq[1],
            uniq[2],
            uniq[3],
            wins / episodes as f64
        );
    }
    Ok(())
}
