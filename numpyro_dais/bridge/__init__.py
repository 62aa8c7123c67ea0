"""The NumPyro side every guide stands on: the base classes of the guides, the model seen
from a guide, and every use of NumPyro's private API.

* :mod:`~numpyro_dais.bridge.autoguide` — ``ContinuousGuide``, the base of every flat guide;
* :mod:`~numpyro_dais.bridge.template` — ``DrawTemplate``, every guide's
  ``sample_posterior`` skeleton, and ``GuideTemplate``, a flat guide's training call, whose
  hooks the guides fill in;
* :mod:`~numpyro_dais.bridge.modelview` — the model's log joint in the flat unconstrained
  space, and its plates;
* :mod:`~numpyro_dais.bridge.numpyro_private` — NumPyro's private names, each use with its why
  (no other module touches one);
* :mod:`~numpyro_dais.bridge.checks` — argument checks whose errors name the argument and the
  fix.
"""

from numpyro_dais.bridge.autoguide import ContinuousGuide
from numpyro_dais.bridge.modelview import ModelView, log_joint
from numpyro_dais.bridge.template import GuideTemplate

__all__ = ["ContinuousGuide", "GuideTemplate", "ModelView", "log_joint"]
