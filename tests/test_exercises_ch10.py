"""The chapter-10 checkers accept the worked solutions and name what a wrong answer got wrong."""

from grpo_edu.runtime.distributed import World
from grpo_edu.exercises import ch10
from grpo_edu.algorithm.loss import grpo_loss

# ----------------------------------------------------------------- 9.1


def rank_rows(B, G, world_size, rank):
    """The worked solution: whole prompts, rank r's contiguous B / N of them, all G rows of each."""
    if B % world_size:
        raise ValueError(f"{B} prompts do not split into whole prompts over {world_size} ranks")
    per_rank = B // world_size
    return list(range(rank * per_rank * G, (rank + 1) * per_rank * G))


def test_rank_rows_solution_passes_and_is_the_trainers_share():
    result = ch10.check_rank_rows(rank_rows)
    assert result and result.passed == len(ch10.RANK_ROW_CASES) + len(ch10.INDIVISIBLE_CASES)
    share = World(rank=1, size=2).shard(16)
    assert rank_rows(16, 8, 2, 1) == list(range(share.start * 8, share.stop * 8))


def test_an_even_split_of_the_rows_is_caught_where_it_cuts_a_group():
    def even_rows(B, G, world_size, rank):
        n = B * G // world_size
        return list(range(rank * n, (rank + 1) * n))
    result = ch10.check_rank_rows(even_rows)
    assert result.passed == len(ch10.RANK_ROW_CASES)
    assert len(result.failures) == 2
    assert result.failures[1] == (
        "B=3, G=4, 2 ranks: 3 prompts do not split into whole prompts over 2 ranks, so the trainer refuses "
        "(a ValueError); yours split prompt 1's 4 completions across ranks [0, 1]")


def test_other_wrong_rows_are_named():
    def interleaved(B, G, world_size, rank):   # whole prompts, but not the trainer's share
        if B % world_size:
            raise ValueError("indivisible")
        return [i * G + j for i in range(rank, B, world_size) for j in range(G)]
    result = ch10.check_rank_rows(interleaved)
    assert result.failures[0].startswith("B=16, G=8, 2 ranks: rank 0 (and 1 other rank) owns whole prompts, "
                                         "but not consecutive ones")
    assert "rows 0..63" not in str(result)       # the trainer's share is the answer: never printed

    def reversed_blocks(B, G, world_size, rank):   # contiguous blocks, in the wrong order
        return rank_rows(B, G, world_size, world_size - 1 - rank)
    result = ch10.check_rank_rows(reversed_blocks)
    assert "rank 0 (and 1 other rank) owns a contiguous block of whole prompts (rows 64..127), but not the " \
           "trainer's" in result.failures[0]

    def prompt_indices(B, G, world_size, rank):  # prompts, not rows
        if B % world_size:
            raise ValueError("indivisible")
        return rank_rows(B, 1, world_size, rank)
    result = ch10.check_rank_rows(prompt_indices)
    assert any("no rank owns" in failure for failure in result.failures)
    assert any("completions across ranks" in failure for failure in result.failures)

    raises = ch10.check_rank_rows(lambda *args: 1 / 0)
    assert "rank 0 raised ZeroDivisionError" in raises.failures[0]
    assert raises.failures[-1] == ("B=3, G=4, 2 ranks: raised ZeroDivisionError: division by zero; 3 prompts do "
                                   "not split into whole prompts over 2 ranks, so the trainer refuses (a ValueError)")


# ----------------------------------------------------------------- 9.2

def rank_loss(logp, old_logp, advantages, completion_mask, token_counts, completion_counts, loss_type,
              max_completion_length):
    """The worked solution: the whole batch's counts, times N (DDP averages the gradients)."""
    out = grpo_loss(logp, old_logp, advantages, completion_mask, loss_type=loss_type,
                    max_completion_length=max_completion_length,
                    num_items=sum(token_counts), num_completions=sum(completion_counts))
    return out.loss * len(token_counts)


def test_rank_loss_solution_passes():
    result = ch10.check_rank_loss(rank_loss)
    assert result and result.passed == 2 * 4


def test_the_per_rank_mean_is_named():
    def own_counts(logp, old_logp, advantages, mask, token_counts, completion_counts, loss_type, L):
        return grpo_loss(logp, old_logp, advantages, mask, loss_type=loss_type, max_completion_length=L).loss
    result = ch10.check_rank_loss(own_counts)
    # grpo and dr_grpo with equal completions per rank hide the mistake; token counts or
    # uneven completions reveal it.
    assert result.passed == 2 and len(result.failures) == 6
    assert result.failures[0] == ("bnpo, 2 ranks of 2 prompts, rank 1's completions longer: each rank divided "
                                  "by its own counts (grpo_loss's defaults), not the whole batch's")
    assert all("each rank divided by its own counts" in f for f in result.failures)


def test_a_missing_world_size_factor_is_named():
    def without_factor(*args):
        return rank_loss(*args) / len(args[4])
    result = ch10.check_rank_loss(without_factor)
    assert len(result.failures) == 8
    assert result.failures[0].endswith("the whole batch's counts, but DDP averages the ranks' gradients: 1/2 of "
                                       "the 1-process gradient")
    assert "1/3 of the 1-process gradient" in result.failures[-1]


def test_rank_loss_reports_wrong_types():
    constant = ch10.check_rank_loss(lambda *args: args[0].detach().sum())
    assert "does not depend on logp" in constant.failures[0]
    number = ch10.check_rank_loss(lambda *args: 0.5)
    assert "expected a scalar tensor" in number.failures[0]


# ----------------------------------------------------------------- 9.3

def test_scale_answers():
    answers = ch10.scale_answers()
    assert answers == {"prompts_per_rank": 32, "completions_per_rank": 512, "completions_per_step": 4096,
                       "max_tokens_per_step": 4_194_304, "optimizer_steps_per_rollout": 4,
                       "fsdp2_bytes_per_rank": 3_000_000_000}
    assert set(answers) == set(ch10.QUANTITIES)
    assert ch10.check_scale_answers(ch10.scale_answers)

    def ddp_bytes(quiz):                            # DDP's bytes: a whole replica on every rank
        return dict(ch10.scale_answers(quiz), fsdp2_bytes_per_rank=quiz["parameters"] * 16)
    result = ch10.check_scale_answers(ddp_bytes, seed=0)
    assert result.failures == [
        "SCALE_QUIZ: fsdp2_bytes_per_rank is wrong: a whole copy on every rank (DDP's), not FSDP2's 1/N shard",
        "ch10.random_quiz(1): the same as SCALE_QUIZ", "ch10.random_quiz(2): the same as SCALE_QUIZ"]
    report = str(ch10.check_scale_answers(lambda quiz: {}, seed=0))
    assert "no number for prompts_per_rank, completions_per_rank" in report
    assert "unknown keys ['tokens']" in str(ch10.check_scale_answers(lambda quiz: dict(ch10.scale_answers(quiz),
                                                                                         tokens=1)))
    assert "returned list, not a dict" in str(ch10.check_scale_answers(lambda quiz: []))
