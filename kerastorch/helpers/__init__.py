"""Small things every layer of the package uses, importing nothing of it above them: seeding every
random generator (:mod:`~kerastorch.helpers.seed`)."""
