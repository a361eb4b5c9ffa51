-- Reserved for the migration of the tool signatures and erasure markers (issue #36), which is
-- written on another branch; that branch's file replaces this one when both are merged.
SELECT 1;
