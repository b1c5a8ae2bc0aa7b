"""Moved to `tandem.sizing.drain` (the drain stage of the sizing chain); the names stay importable here."""

from tandem.sizing.drain import (
    DRAIN_POLL_SECONDS as DRAIN_POLL_SECONDS,
)
from tandem.sizing.drain import (
    DRAIN_SETTLE_SECONDS as DRAIN_SETTLE_SECONDS,
)
from tandem.sizing.drain import (
    DrainPlan as DrainPlan,
)
from tandem.sizing.drain import (
    Load as Load,
)
from tandem.sizing.drain import (
    PodView as PodView,
)
from tandem.sizing.drain import (
    drained_names as drained_names,
)
from tandem.sizing.drain import (
    idle as idle,
)
from tandem.sizing.drain import (
    loads_needed as loads_needed,
)
from tandem.sizing.drain import (
    plan as plan,
)
from tandem.sizing.drain import (
    pod_views as pod_views,
)
