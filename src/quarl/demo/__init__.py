"""``quarl demo``, the main job: every agent of a zoo folder at each precision as the paper's
table (:mod:`quarl.demo.run`)."""
