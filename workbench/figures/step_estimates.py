"""How long each preparation step of ``workbench figures`` takes, for scheduling a cold start.

:func:`workbench.figures.schedule.prepare` starts, among the ready steps, the one with the longest remaining
chain of work. It measures every step and remembers the seconds in the home (``stores/<profile>/step_seconds.json``);
before the first run there is nothing to remember, so these estimates stand in. Without them every step counts one
second and a cold ``workbench figures --all`` on two cores leaves one idle for the last minute (simulated over the
measured times: 895 s for the shared steps instead of 857). Measured in a cold ``workbench figures --all
--profile demo`` on the 2-core development machine (seconds of one core; a step missing here counts one second).
"""

from __future__ import annotations

#: profile -> data id -> seconds.
ESTIMATES: dict[str, dict[str, float]] = {
    "demo": {
        "attentionlite.at_maps": 2,
        "attentionlite.baselines": 130,  # issue 19 (this and the other *.baselines: estimated, docs/budgets.md)
        "attentionlite.density": 0,
        "attentionlite.fig2": 134,  # 6 epochs (issue 19; 67 s at 3)
        "attentionlite.fig3": 126,  # 6 epochs (63 s at 3)
        "attentionlite.local_attention": 0,
        "attentionlite.paper_size": 9,
        "attentionlite.table1": 1,
        "attentionlite.table2": 1,
        "compare.cnn": 15,
        "compare.latency": 4,
        "compare.swin": 12,
        "compare.vit": 32,
        "far.agreement": 1,
        "far.maps": 2,
        "far.retention": 0,
        "far.runs": 177,
        "far.table2": 50,
        "far.table3": 203,
        "nondeep.attention": 1,
        "nondeep.baselines": 28,
        "nondeep.exactness": 19,
        "nondeep.fig4": 13,
        "nondeep.fig5": 0,
        "nondeep.fig6": 2,
        "nondeep.memory": 14,
        "nondeep.schedules": 0,
        "nondeep.students": 68,
        "nondeep.table1": 7,
        "nondeep.table5": 55,
        "slimswin.baselines": 190,
        "slimswin.breakdown": 0,
        "slimswin.masks": 2,
        "slimswin.saliency": 1,
        "slimswin.sweep": 91,
        "slimswin.table1": 0,
        "sparsifiner.agreement": 2,
        "sparsifiner.baselines": 65,
        "sparsifiner.basis": 1,
        "sparsifiner.flops": 0,
        "sparsifiner.maps": 1,
        "sparsifiner.runs": 104,
        "teacher.attention": 0,
        "teacher.cnn": 70,
        "teacher.swin": 150,
        "teacher.vit": 247,
    },
}


def estimate(profile: str, step: str) -> float:
    """Seconds ``step`` is expected to take under ``profile`` (one when unknown)."""
    return ESTIMATES.get(profile, {}).get(step, 1.0)
