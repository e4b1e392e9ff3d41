"""Tools over a recorded journal: re-judging verdicts and counterfactual replay."""
