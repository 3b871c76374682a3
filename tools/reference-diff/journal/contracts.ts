// Why: the reference journal (shared/seeds/engagement-journal.ts) imports './contracts.js', which
// was not part of the seed. record.ts points that import here (a Bun resolver plugin), so the
// reference itself runs unmodified. Only the runtime values it imports are needed (its type
// imports are erased): the budget keys, the default retention of FORMAT.md §4.1, and the error
// class whose name is the fixtures' error kind (FORMAT.md §2.3).
export const BUDGET_KEYS = ['modelCalls', 'tokens', 'wallMs', 'sideEffects'] as const;
export const DEFAULT_JOURNAL_RETENTION = { maxEventsPerEngagement: 10000, maxAgeMs: 2592000000 };
export class JournalFullError extends Error {
  constructor(readonly engagementId: string, readonly max: number) {
    super(`engagement ${engagementId} holds ${max} events`);
    this.name = 'JournalFullError';
  }
}
