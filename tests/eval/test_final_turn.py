"""A multi-turn episode is scored on the model's last turn only: a tool's output is never read as its answer."""

from __future__ import annotations

import numpy as np

from asyncrl import records as R
from asyncrl.evaluation.live import final_turn, response
from asyncrl.reward.strict import strict_score

# model turn (calls the calculator) | tool output | model turn (the answer)
CALL, TOOL, ANSWER = [11, 12, 13], [21, 22], [31, 32]
WORDS = {11: "<tool_call>", 12: "7*8", 13: "</tool_call>", 21: "<tool_response>56", 22: "</tool_response>",
         31: "It is", 32: "54"}


def decode(ids) -> str:
    return " ".join(WORDS[int(i)] for i in ids)


def sample(segments: list[tuple[list[int], int]]) -> R.ScoredSample:
    ids = np.asarray([t for seg, _ in segments for t in seg], dtype=np.int32)
    mask = np.asarray([m for seg, m in segments for _ in seg], dtype=np.int32)
    s = R.Sample(prompt_id="eval-0-g", sample_index=0, prompt_token_ids=np.zeros(2, np.int32),
                 response_token_ids=ids, logprobs=np.zeros(len(ids), np.float32), versions=np.zeros(len(ids), np.int32),
                 finish_reason=R.FinishReason.STOP, response_text=decode(ids), loss_mask=mask)
    return R.ScoredSample(sample=s, reward=0.0)


def test_the_last_model_turn_is_what_is_scored():
    scored = sample([(CALL, 1), (TOOL, 0), (ANSWER, 1)])
    assert final_turn(scored.sample.response_token_ids, scored.sample.loss_mask).tolist() == ANSWER
    spec = R.RewardSpec(target="56")
    assert strict_score(scored.sample.response_text, spec) == 0.0  # the whole episode ends on the model's 54
    assert response(scored.sample, decode).text == "It is 54"


def test_an_episode_ending_on_a_tool_output_has_no_answer():
    scored = sample([(CALL, 1), (TOOL, 0)])
    spec = R.RewardSpec(target="56")
    assert strict_score(scored.sample.response_text, spec) == 1.0  # read whole, the calculator's 56 would count
    text = response(scored.sample, decode).text
    assert text == "" and strict_score(text, spec) == 0.0


def test_single_turn_samples_keep_their_text():
    scored = sample([(ANSWER, 1)])
    assert response(scored.sample, decode).text == scored.sample.response_text == "It is 54"
    assert response(sample([(CALL, 1), (TOOL, 0), (ANSWER, 1)]).sample).text.endswith("54")  # no decoder: as before
