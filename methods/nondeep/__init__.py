"""Non-deep ViT (tmp init)."""
from .branched import *  # noqa
from .collapse import *  # noqa
from .forms import *  # noqa
from .schedules import *  # noqa
from .layernorm import *  # noqa
