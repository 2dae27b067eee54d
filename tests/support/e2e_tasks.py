"""SumDigitsTask under other names: task names are unique, so one end-to-end run can train it with several algorithms."""

from tasks.sum_digits import SumDigitsTask


class SelfDistilledDigits(SumDigitsTask):
    """For opsd: the row's `answer` is the demonstration shown to the policy-as-teacher."""


class TeacherSampledDigits(SumDigitsTask):
    """For sft from a frozen sampler: the teacher writes the rollouts, the policy learns them by cross-entropy."""


class DemonstratedDigits(SumDigitsTask):
    """For sft from the dataset: the row's `answer` is the demonstration, and nothing is generated."""
